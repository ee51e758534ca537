"""`plan()`: the engine for one model on one host, its options, and why (a pure function)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from adapters import registry
from gateway.hardware import HardwareSnapshot
from gateway.lora.summary import LoraPlan
from gateway.planning.capacity import (
    Capacity,
    KvSizing,
    MemoryPool,
    assess,
    kv_bytes,
    max_context,
    paged_kv_bytes,
)
from gateway.planning import features
from gateway.planning.explain import explain, gb, memory_figures
from gateway.planning.features import FeatureDecision
from gateway.planning.formats import format_advice
from gateway.planning.gpu_count import choose_gpus
from gateway.planning.installed import Installed, is_installed
from gateway.planning.kv_type import better, bought, fp8_supported, kv_cost, kv_limit
from gateway.planning.measured import Calibration, Measured
from gateway.planning.options import Layout, engine_options
from gateway.planning.overrides import OptionOverride
from gateway.planning.pools import GPU_MEMORY_FRACTION, fast_pools, host_gpus, place, system_pool
from gateway.planning.selection import Candidate, Rejection, RuleBook, load_rules, rank, violations
from gateway.planning.specs import ModelSpec
from gateway.planning.speed import slow_warning
from gateway.planning.unknowns import host_unknowns, model_unknowns, unused_accelerators
from gateway.planning.workload import Accelerator, Interconnect, Profile, Workload, heaviness

DEFAULT_CONTEXT = 4096
"""Context used when the model does not state its trained length."""


class Plan(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    engine: str
    options: dict[str, Any] = Field(default_factory=dict)
    rule: str | None = None
    """The selection rule that chose the engine (`requested` when the config named it)."""
    overridden: tuple[OptionOverride, ...] = ()
    """The plan's choices that the user's explicit settings replaced (see overrides.py)."""
    reasons: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    assumed: tuple[str, ...] = ()
    """What the planner could not read (probes that failed, sizes not reported, figures not in the
    hardware table, config keys missing) and what it assumed instead."""
    installed: bool = True
    model: str | None = None
    spec: ModelSpec | None = None
    candidates: tuple[Candidate, ...] = ()
    rejected: tuple[Rejection, ...] = ()
    capacity: Capacity | None = None
    profile: Profile | None = None
    measured: Measured | None = None
    """The `enginegate tune` record that matched this host, model and workload (see gateway/tuning)."""
    calibration: Calibration | None = None
    """Speed predictions scaled by this host's tune records for the plan's engine (capacity holds the result)."""
    features: tuple[FeatureDecision, ...] = ()
    """The engine's own speed-ups (speculation, KV cache type, prefix and prompt caches, batching), each with its reason."""
    notes: tuple[str, ...] = ()
    """What the host has that this plan does not use (accelerators with no probe or engine)."""
    lora: LoraPlan | None = None
    """The model's LoRA adapters and the engine's LoRA flags for them (docs/lora.md); None without adapters."""

    def summary(self) -> str:
        return f"{self.engine}: {self.reasons[0]}" if self.reasons else self.engine


class NoEngineError(ValueError):
    """No engine can serve this model on this host; the message lists every constraint that failed."""

    def __init__(self, spec: ModelSpec, rejected: list[Rejection], figures: str = "") -> None:
        self.rejected = rejected
        self.figures = figures
        grouped: dict[str, list[str]] = {}
        for r in rejected:
            detail = r.detail.removesuffix(f": {figures}") if figures else r.detail
            if detail not in grouped.setdefault(r.engine, []):
                grouped[r.engine].append(detail)
        lines = "; ".join(f"{engine}: {', '.join(details)}" for engine, details in grouped.items())
        memory = f". Memory: {figures}" if figures and any(r.constraint == "memory" for r in rejected) else ""
        super().__init__(f"no engine can serve {spec.path} ({spec.format}) on this host: {lines}{memory}")


def _accelerator(s: HardwareSnapshot) -> Accelerator:
    if s.nvidia and s.nvidia.gpus:
        return "nvidia"
    if s.amd and s.amd.gpus:
        return "amd"
    if s.apple:
        return "apple"
    return "none"


def _interconnect(s: HardwareSnapshot) -> Interconnect:
    if s.nvidia and s.nvidia.gpus:
        if any(g.nvswitch for g in s.nvidia.gpus):
            return "nvswitch"
        if any(g.nvlink_peers for g in s.nvidia.gpus):
            return "nvlink"
        return "pcie"
    if s.amd and s.amd.gpus:
        return "xgmi" if any(g.link_type == "XGMI" for g in s.amd.gpus) else "pcie"
    return "unified" if s.apple else "none"


def _gpu_count(s: HardwareSnapshot) -> int:
    if s.nvidia:
        return len(s.nvidia.gpus)
    return len(s.amd.gpus) if s.amd else 0


def _profile(s: HardwareSnapshot, spec: ModelSpec, w: Workload, fit: str, context: int, figures: str) -> Profile:
    gpus = s.nvidia.gpus if s.nvidia else ()
    ccs = [g.compute_capability[0] + g.compute_capability[1] / 10 for g in gpus if g.compute_capability]
    return Profile(
        accelerator=_accelerator(s),
        gpus=_gpu_count(s),
        consumer_gpu=bool(gpus) and all("GeForce" in g.name or "TITAN" in g.name for g in gpus),
        min_compute_capability=min(ccs) if ccs else None,
        fit=fit,  # type: ignore[arg-type]
        heavy=heaviness(w.prompt_tokens, w.output_tokens),
        context_length=w.context_length or min(context, w.prompt_tokens + w.output_tokens),
        concurrency=w.concurrency,
        shared_prefix=w.shared_prefix,
        family=spec.family,
        moe=bool(spec.experts),
        mode=w.mode,
        format=spec.format,
        interconnect=_interconnect(s),
        objective=w.objective,
        nodes=w.nodes,
        architecture=s.cpu.architecture,
        memory_gib=None if s.memory.total_bytes is None else s.memory.total_bytes / 2**30,
        memory_figures=figures,
    )


def _target_context(spec: ModelSpec, w: Workload, warnings: list[str], assumed: list[str]) -> int:
    """The workload's context, else the trained one (else DEFAULT_CONTEXT, with a warning)."""
    trained = spec.context_length
    if w.context_length is not None:
        if trained and w.context_length > trained:
            warnings.append(
                f"context {w.context_length} exceeds the model's trained {trained} tokens: quality may drop"
            )
        return w.context_length
    if trained is None:
        assumed.append(f"model: no trained context length stated: assumed {DEFAULT_CONTEXT} tokens")
        return DEFAULT_CONTEXT
    return trained


def _kv_need(spec: ModelSpec, w: Workload, context: int, sizing: KvSizing) -> int:
    """KV bytes for the workload: a paged pool, or concurrency x full context reserved."""
    if sizing == "paged":
        return paged_kv_bytes(spec, context, w.concurrency, w.prompt_tokens + w.output_tokens, w.kv_dtype)
    return kv_bytes(spec, context, w.kv_dtype) * w.concurrency


def _lowered(
    spec: ModelSpec,
    w: Workload,
    context: int,
    pool: MemoryPool,
    sizing: KvSizing,
    warnings: list[str],
) -> int:
    """The context, lowered (with a warning naming why) when the user left it open and it does not fit `pool`."""
    weights = spec.weight_bytes or 0
    typical = w.prompt_tokens + w.output_tokens
    if w.context_length is not None or not pool.known or weights >= pool.usable_bytes:
        return context
    kv = _kv_need(spec, w, context, sizing)
    if weights + kv <= pool.usable_bytes:
        return context
    fitting = max_context(
        spec, pool.usable_bytes, weights, w.concurrency, w.kv_dtype, context, typical if sizing == "paged" else None
    )
    if fitting < min(DEFAULT_CONTEXT, context):
        return context
    capped = fitting // 256 * 256
    what = (
        f"one sequence at {context} tokens (beside {w.concurrency} x {typical} typical) needs {gb(kv)} of KV"
        if sizing == "paged"
        else f"{w.concurrency} sequence(s) x {context} tokens need {gb(kv)} of KV"
    )
    where = {
        "vram": f"{pool.devices} GPU(s)",
        "unified": "unified memory",
        "system": "system RAM",
        "split": "GPU memory and RAM together",
    }[pool.kind]
    warnings.append(
        f"context lowered from the trained {context} to {capped} tokens: {what}, but {where} can hold "
        f"{gb(pool.usable_bytes - weights)} beside the {gb(weights)} of weights (set context_length to choose)"
    )
    return capped


def _layout(
    engine: str,
    pool: MemoryPool,
    fit: str,
    spec: ModelSpec,
    w: Workload,
    s: HardwareSnapshot,
    context: int,
    replicas: int = 1,
    kv_need: int = 0,
) -> Layout:
    gpus = pool.devices if pool.kind == "vram" else 0
    tp, pp = (pool.tensor_parallel, pool.pipeline_parallel) if gpus else (1, 1)
    facts = registry.spec(engine)
    if not facts.tensor_parallel:
        tp, pp = 1, max(gpus, 1)
    gpu_layers = 0
    if pool.kind in ("vram", "unified") and fit == "fast":
        gpu_layers = -1
    elif fit != "fast" and facts.partial_offload and spec.layers and spec.weight_bytes:
        fast = fast_pools(s)
        if fast and fast[-1].known:
            gpus = fast[-1].devices if fast[-1].kind == "vram" else 0
            # all the KV on the GPUs first (leaves headroom for compute buffers); when it alone is too big,
            # each offloaded layer brings its own share of the KV, as llama.cpp places it
            kv_first = (fast[-1].split_bytes - kv_need) // (spec.weight_bytes / spec.layers)
            by_layer = fast[-1].split_bytes // ((spec.weight_bytes + kv_need) / spec.layers)
            gpu_layers = max(0, min(spec.layers, int(kv_first if kv_first > 0 else by_layer)))
            pp = max(gpus, 1)
    return Layout(
        gpus=gpus,
        tensor_parallel=max(tp, 1),
        pipeline_parallel=max(pp, 1),
        gpu_layers=gpu_layers,
        gpu_memory_fraction=GPU_MEMORY_FRACTION,
        context_length=context,
        concurrency=w.concurrency,
        kv_dtype=w.kv_dtype,
        threads=_engine_threads(s),
        shared_prefix=w.shared_prefix,
        data_parallel=replicas,
    )


def _engine_threads(s: HardwareSnapshot) -> int | None:
    """CPU threads for llama.cpp: every core but one, which the gateway keeps for its event loop.

    Measured on a 2-vCPU host (benchmarks/gateway_vs_direct.py): llama.cpp decoded as fast with 1
    thread as with 2, and with 2 the gateway added 6.4 ms to the first token and lost 3 % of the
    decode rate to the contention, against 2.2 ms and 0.3 % with 1.
    """
    cores = s.cpu.physical_cores or s.cpu.logical_cores
    return None if cores is None else max(1, cores - 1)


def _capacity(
    spec: ModelSpec,
    pool: MemoryPool,
    fit: str,
    lay: Layout,
    w: Workload,
    s: HardwareSnapshot,
    sizing: KvSizing,
) -> Capacity:
    common: dict[str, Any] = {
        "context_length": lay.context_length,
        "concurrency": w.concurrency,
        "kv_dtype": w.kv_dtype,
        "prompt_tokens": w.prompt_tokens,
        "output_tokens": w.output_tokens,
        "sizing": sizing,
    }
    fast = fast_pools(s)
    if fit != "fast" and lay.gpu_layers > 0 and fast and spec.layers:
        share_in_ram = 1 - lay.gpu_layers / spec.layers
        partial = assess(spec, fast[-1], fit=fit, offload=(share_in_ram, s.cpu.measured_bandwidth_gbps), **common)  # type: ignore[arg-type]
        ram = assess(spec, pool, fit=fit, **common)  # type: ignore[arg-type]
        return ram.model_copy(update={"decode_tokens_per_s": partial.decode_tokens_per_s})
    return assess(spec, pool, fit=fit, tensor_parallel=lay.tensor_parallel, replicas=lay.data_parallel, **common)  # type: ignore[arg-type]


def _reserves_kv(engine: str) -> bool:
    """The engine reserves each slot's full context up front; every other engine pages its KV cache."""
    return not registry.spec(engine).paged_kv


def _home(
    snapshot: HardwareSnapshot, pools: list[MemoryPool], weights: int, fast_split: bool, with_ram: bool
) -> MemoryPool:
    """Where the context must fit: the largest fast pool if the weights fit there, else RAM (+ the GPUs' share).

    fast_split: count GPU memory as llama.cpp does (the sum); with_ram: the engine can keep layers in RAM.
    """
    if pools:
        # with mixed GPU sizes one big card can hold more than all of them sharded evenly
        top = max(pools, key=lambda p: (not p.known, p.split_bytes if fast_split else p.usable_bytes))
        room = top.split_bytes if fast_split else top.usable_bytes
        if not top.known or weights < room:
            return top.model_copy(update={"usable_bytes": room})
    ram = system_pool(snapshot)
    if with_ram and pools and pools[-1].kind == "vram" and ram.known and pools[-1].known:
        return ram.model_copy(update={"kind": "split", "usable_bytes": ram.usable_bytes + pools[-1].split_bytes})
    return ram


def _gpu_selection(engine: str, cap: Capacity, lay: Layout, snapshot: HardwareSnapshot) -> dict[str, Any]:
    """Options that keep the engine on the planned GPUs when others stay free.

    Engines take GPUs 0..n-1 (llama.cpp: all of them) unless told: server engines get
    CUDA_VISIBLE_DEVICES (HIP_VISIBLE_DEVICES on AMD), llama.cpp a tensor split with 0 for free GPUs.
    """
    if not cap.gpus or not cap.free_gpus:
        return {}
    if engine == "llamacpp":
        if lay.gpu_layers == 0:
            return {}
        memory = {g.index: g.memory_bytes or 0 for g in host_gpus(snapshot)}
        return {"tensor_split": [round(memory[i] / 2**30) if i in cap.gpus else 0 for i in sorted(memory)]}
    if _reserves_kv(engine):
        return {}
    var = "HIP_VISIBLE_DEVICES" if snapshot.amd and snapshot.amd.gpus and not snapshot.nvidia else "CUDA_VISIBLE_DEVICES"
    return {"env": {var: ",".join(map(str, cap.gpus))}}


def _priority_classes(engine: str, w: Workload, options: dict[str, Any]) -> list[str]:
    """A workload with priority classes: the engine's priority scheduling, where it has one (with the reason)."""
    if not w.priority_classes:
        return []
    wanted = registry.spec(engine).priority_options
    if not wanted:
        return [f"{engine} has no priority scheduling: the gateway's queue order is the only lever for service tiers"]
    options.update(wanted)
    shown = " ".join(f"{k}={v}" for k, v in wanted.items())
    return [f"the workload has priority classes: {engine} schedules by each request's priority ({shown}); "
            f"the gateway sends priority 0, default 1, flex 2"]


def _choose_engine(
    book: RuleBook, profile: Profile, ranked: list[Candidate], check: Installed
) -> tuple[Candidate | None, list[Rejection], list[Candidate]]:
    rejected: list[Rejection] = []
    not_installed: list[Candidate] = []
    for cand in ranked:
        failed = violations(cand.engine, book.engines[cand.engine], profile, check)
        if not failed:
            return cand, rejected, not_installed
        rejected += failed
        if all(f.constraint == "installed" for f in failed):
            not_installed.append(cand)
    return None, rejected, not_installed


def _plan(
    snapshot: HardwareSnapshot,
    spec: ModelSpec,
    w: Workload,
    requested_engine: str,
    installed: Installed | None,
    rules: RuleBook | Path | None,
) -> Plan:
    # An engine run as another mode of a planned engine (llama_server of llamacpp) is planned as that one.
    planned_as = registry.spec(requested_engine).plans_as if requested_engine != "auto" else None
    mode = requested_engine if planned_as else None
    requested_engine = planned_as or requested_engine
    base_check = installed or is_installed

    def check(engine: str) -> bool:
        return base_check(mode if mode and engine == requested_engine else engine)

    book = rules if isinstance(rules, RuleBook) else load_rules(rules)
    weights = spec.weight_bytes
    if weights is None:
        raise ValueError(f"{spec.path}: the weights' size is unknown, so capacity cannot be planned")
    reasons: list[str] = []
    warnings: list[str] = []
    assumed = host_unknowns(snapshot) + model_unknowns(spec)
    if spec.weights_check:
        warnings.append(spec.weights_check)
    typical = w.prompt_tokens + w.output_tokens
    pools = fast_pools(snapshot)

    # Fit as a paged engine would use memory: this is the fit the rules and hard constraints read.
    trained_or_set = _target_context(spec, w, warnings, assumed)
    paged_warnings: list[str] = []
    home = _home(snapshot, pools, weights, fast_split=False, with_ram=True)
    context = _lowered(spec, w, trained_or_set, home, "paged", paged_warnings)
    need = weights + _kv_need(spec, w, context, "paged")
    choice = choose_gpus(snapshot, pools, need, weights, w, spec.attention_heads)
    pool, fit = (choice.pool, "fast") if choice else place(snapshot, need)
    figures = memory_figures(snapshot, spec, w, context, need)
    profile = _profile(snapshot, spec, w, fit, context, figures)
    ranked = rank(book, profile)
    chosen: Candidate | None = None
    rejected: list[Rejection] = []
    not_installed: list[Candidate] = []
    if requested_engine != "auto":
        if requested_engine not in book.engines:
            raise ValueError(f"engine {requested_engine!r} cannot be planned (its spec declares no layout options); "
                             f"plannable: {', '.join(book.engines)}")
        chosen = Candidate(
            engine=requested_engine,
            rank=0,
            rule="requested",
            because=f"engine {mode or requested_engine!r} set in the model's config",
        )
        for v in violations(requested_engine, book.engines[requested_engine], profile, check):
            install = registry.spec(mode).install_hint if mode and v.constraint == "installed" else v.install
            warnings.append(
                f"{mode or requested_engine} was requested but {v.detail}" + (f": {install}" if install else "")
            )
    else:
        chosen, rejected, not_installed = _choose_engine(book, profile, ranked, check)
    is_present = True
    if chosen is None:
        if not not_installed:
            tried = {r.engine for r in rejected}
            extra = [r for e, n in book.engines.items() if e not in tried for r in violations(e, n, profile, None)]
            raise NoEngineError(spec, rejected + extra, figures)
        chosen = not_installed[0]
        is_present = False
        install = book.engines[chosen.engine].install
        warnings.append(f"{chosen.engine} is the best engine for this host but is not installed: {install}")
    tried = {r.engine for r in rejected} | {chosen.engine}
    for engine, needs in book.engines.items():
        if engine not in tried:
            rejected += violations(engine, needs, profile, None)
    reasons.insert(0, f"{chosen.because} [rule: {chosen.rule}]")

    serve_as = mode
    if chosen.engine == "llamacpp" and mode is None and requested_engine == "auto" and (
        w.concurrency > 1 or w.mode != "local"
    ):
        serve_as = "llama_server"
        reasons.append(
            f"{w.concurrency} concurrent sequence(s) in {w.mode} use: llama-server with {w.concurrency} slots "
            "(the in-process adapter decodes one request at a time)"
        )
    elif chosen.engine == "llamacpp" and mode is None and requested_engine == "auto" and features.speculation_pays(
        w, on_gpu=_accelerator(snapshot) != "none" and fit == "fast"
    ):
        serve_as = "llama_server"
        reasons.append("outputs copy the prompt: llama-server, for its n-gram speculation (the in-process adapter has none)")
    sizing: KvSizing = "paged" if not _reserves_kv(chosen.engine) or serve_as == "llama_server" else "reserved"
    replicas = 1
    if not _reserves_kv(chosen.engine):
        warnings += paged_warnings
        replicas = choice.replicas if choice else 1
        if choice:
            reasons.append(choice.why)
    else:
        # llama.cpp splits layers by each GPU's memory and can leave some in RAM; MLX uses unified memory
        split = registry.spec(chosen.engine).partial_offload
        context = _lowered(spec, w, trained_or_set, _home(snapshot, pools, weights, split, split), sizing, warnings)
        pool, fit = place(snapshot, weights + _kv_need(spec, w, context, sizing), split=split)
        if split and pool.kind == "vram":
            pool = pool.model_copy(update={"usable_bytes": pool.split_bytes})
    lay = _layout(chosen.engine, pool, fit, spec, w, snapshot, context, replicas, _kv_need(spec, w, context, sizing))
    cap = _capacity(spec, pool, fit, lay, w, snapshot, sizing)
    gpus = host_gpus(snapshot)
    if choice and not _reserves_kv(chosen.engine) and pool.kind == "vram":
        cap = cap.model_copy(update={"gpus": choice.gpus, "free_gpus": choice.free})
    elif pool.kind == "vram" or (fit != "fast" and lay.gpu_layers > 0):
        used = pool.indexes or tuple(g.index for g in gpus)[: lay.gpus]
        cap = cap.model_copy(update={"gpus": used, "free_gpus": tuple(g.index for g in gpus if g.index not in used)})
    options = engine_options(serve_as or chosen.engine, lay)
    options.update(_gpu_selection(chosen.engine, cap, lay, snapshot))
    reasons += _priority_classes(serve_as or chosen.engine, w, options)
    mode = serve_as
    if mode == "llama_server":
        tokens = max(w.concurrency * min(typical, context), context)
        options["context_length"] = tokens
        options["extra_args"] = ["--kv-unified"]
        reasons.append(
            f"llama.cpp runs as llama-server, its own process: its {w.concurrency} slot(s) share one unified KV "
            f"cache of {tokens} tokens (-c {tokens} --kv-unified: {w.concurrency} x {min(typical, context)} typical, "
            f"any one up to {context})"
        )
    explain(chosen.engine, cap, lay, snapshot, reasons, warnings)
    slow = slow_warning(spec, cap, chosen.engine, w.decode_tokens_per_s, snapshot, book, rejected)
    if slow:
        warnings.append(slow)
    serving = mode or chosen.engine
    on_gpu = profile.accelerator != "none" and lay.gpu_layers != 0
    decisions, chosen_features = features.choose(serving, spec, w, profile, cap, _ram_free(snapshot, cap), on_gpu)
    to_options = registry.spec(serving).feature_options
    if to_options is not None:
        options.update(to_options(chosen_features))
    advice = format_advice(spec, snapshot, cap)
    if advice:
        warnings.append(advice)
    return Plan(
        engine=mode or chosen.engine,
        options=options,
        rule=chosen.rule,
        reasons=tuple(reasons),
        warnings=tuple(warnings),
        assumed=tuple(assumed),
        installed=is_present,
        model=spec.path,
        spec=spec,
        candidates=tuple(ranked),
        rejected=tuple(rejected),
        capacity=cap,
        profile=profile,
        features=tuple(decisions),
        notes=tuple(unused_accelerators(snapshot)),
    )


def _ram_free(snapshot: HardwareSnapshot, cap: Capacity) -> int | None:
    """RAM the plan leaves free: all of it when the model lives in GPU memory, else what its need leaves."""
    ram = system_pool(snapshot)
    if not ram.known:
        return None
    used = cap.required_bytes if cap.memory in ("system", "split", "unified") else 0
    return max(0, ram.usable_bytes - used)


def plan(
    snapshot: HardwareSnapshot,
    spec: ModelSpec,
    workload: Workload | None = None,
    requested_engine: str = "auto",
    installed: Installed | None = None,
    rules: RuleBook | Path | None = None,
) -> Plan:
    """The plan; with the workload's KV type left open, fp16 unless fp16 KV limits what the workload asks."""
    w = workload or Workload()
    if w.kv_dtype is not None:
        chosen = _plan(snapshot, spec, w, requested_engine, installed, rules)
        try:
            auto = plan(snapshot, spec, w.model_copy(update={"kv_dtype": None}), requested_engine, installed, rules)
        except NoEngineError:
            auto = None
        own = next((f for f in auto.features if f.feature == "kv_cache"), None) if auto is not None else None
        if own is None or own.choice == w.kv_dtype:
            return _with_kv(chosen, FeatureDecision(feature="kv_cache", choice=w.kv_dtype, reason="set in the workload"))
        override = f"user override: kv_dtype={w.kv_dtype!r} (set in the workload; the plan chose {own.choice!r}: {own.reason})"
        chosen = chosen.model_copy(update={"reasons": (*chosen.reasons, override)})
        return _with_kv(chosen, FeatureDecision(feature="kv_cache", choice=w.kv_dtype,
                                                reason=f"set in the workload (the plan would choose {own.choice})"))
    try:
        full = _plan(snapshot, spec, w.model_copy(update={"kv_dtype": "fp16"}), requested_engine, installed, rules)
    except NoEngineError as exc:
        return _quantized_or_raise(snapshot, spec, w, requested_engine, installed, rules, exc)
    limit = kv_limit(full, w)
    if limit is None:
        why = "fp16 KV holds the context and the concurrency asked" if full.capacity and full.capacity.memory_known \
            else "memory size unknown: nothing to gain known"
        return _with_kv(full, FeatureDecision(feature="kv_cache", choice="fp16", reason=why))
    quantized = registry.spec(full.engine).quantized_kv
    if quantized is None:
        return _with_kv(full, FeatureDecision(feature="kv_cache", choice="fp16",
                                              reason=f"{limit}, but {full.engine} takes no quantised KV type"))
    gpu = full.profile.min_compute_capability if full.profile else None
    if quantized == "fp8" and not fp8_supported(gpu):
        where = f"compute capability {gpu}" if gpu is not None else "no NVIDIA GPU"
        return _with_kv(full, FeatureDecision(
            feature="kv_cache", choice="fp16",
            reason=f"{limit}; fp8 KV needs Ada/Hopper or newer (compute capability 8.9+), this host has {where}"))
    small = _plan(snapshot, spec, w.model_copy(update={"kv_dtype": quantized}), requested_engine, installed, rules)
    if small.engine != full.engine or small.capacity is None or full.capacity is None or not better(
        small.capacity, full.capacity
    ):
        return _with_kv(full, FeatureDecision(feature="kv_cache", choice="fp16",
                                              reason=f"{limit}; {quantized} KV would not help this plan "
                                                     "(or would change the engine): kept fp16"))
    return _with_kv(small, FeatureDecision(feature="kv_cache", choice=quantized,
                                           reason=f"{limit}: {bought(quantized, full, small)}; {kv_cost(quantized, small)}"))


def _quantized_or_raise(snapshot: HardwareSnapshot, spec: ModelSpec, w: Workload, requested_engine: str,
                        installed: Installed | None, rules: RuleBook | Path | None, exc: NoEngineError) -> Plan:
    """No engine fits at fp16: the first quantised KV type that an engine which takes it fits, else `exc`."""
    for dtype in ("fp8", "q8_0"):
        try:
            small = _plan(snapshot, spec, w.model_copy(update={"kv_dtype": dtype}), requested_engine, installed, rules)
        except NoEngineError:
            continue
        gpu = small.profile.min_compute_capability if small.profile else None
        if registry.spec(small.engine).quantized_kv != dtype or (dtype == "fp8" and not fp8_supported(gpu)):
            continue
        return _with_kv(small, FeatureDecision(
            feature="kv_cache", choice=dtype,
            reason=f"at fp16 no engine fits here ({exc.figures or 'see the rejections'}); {dtype} KV about halves the "
                   f"KV bytes and fits; {kv_cost(dtype, small)}"))
    raise exc


def _with_kv(p: Plan, decision: FeatureDecision) -> Plan:
    return p.model_copy(update={"features": (decision, *p.features)})
