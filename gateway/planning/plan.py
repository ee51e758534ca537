"""`plan()`: the engine for one model on one host, its options, and why (a pure function)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from adapters import registry
from gateway.hardware import HardwareSnapshot
from gateway.planning.capacity import Capacity, MemoryPool, assess, kv_bytes, max_context
from gateway.planning.installed import Installed, is_installed
from gateway.planning.options import Layout, engine_options
from gateway.planning.overrides import OptionOverride
from gateway.planning.pools import GPU_MEMORY_FRACTION, fast_pools, place, system_pool
from gateway.planning.selection import Candidate, Rejection, RuleBook, load_rules, rank, violations
from gateway.planning.specs import ModelSpec
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
    installed: bool = True
    model: str | None = None
    spec: ModelSpec | None = None
    candidates: tuple[Candidate, ...] = ()
    rejected: tuple[Rejection, ...] = ()
    capacity: Capacity | None = None
    profile: Profile | None = None

    def summary(self) -> str:
        return f"{self.engine}: {self.reasons[0]}" if self.reasons else self.engine


class NoEngineError(ValueError):
    """No engine can serve this model on this host; the message lists every constraint that failed."""

    def __init__(self, spec: ModelSpec, rejected: list[Rejection]) -> None:
        self.rejected = rejected
        lines = "; ".join(f"{r.engine}: {r.detail}" for r in rejected)
        super().__init__(f"no engine can serve {spec.path} ({spec.format}) on this host: {lines}")


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


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


def _profile(s: HardwareSnapshot, spec: ModelSpec, w: Workload, fit: str, context: int) -> Profile:
    gpus = s.nvidia.gpus if s.nvidia else ()
    ccs = [g.compute_capability[0] + g.compute_capability[1] / 10 for g in gpus if g.compute_capability]
    return Profile(
        accelerator=_accelerator(s),
        gpus=_gpu_count(s),
        consumer_gpu=bool(gpus) and all("GeForce" in g.name or "TITAN" in g.name for g in gpus),
        min_compute_capability=min(ccs) if ccs else None,
        fit=fit,  # type: ignore[arg-type]
        heavy=heaviness(w.prompt_tokens, w.output_tokens),
        context_length=context,
        concurrency=w.concurrency,
        shared_prefix=w.shared_prefix,
        family=spec.family,
        mode=w.mode,
        format=spec.format,
        interconnect=_interconnect(s),
        objective=w.objective,
        nodes=w.nodes,
        architecture=s.cpu.architecture,
        memory_gib=None if s.memory.total_bytes is None else s.memory.total_bytes / 2**30,
    )


def _context(spec: ModelSpec, w: Workload, snapshot: HardwareSnapshot, reasons: list[str], warnings: list[str]) -> int:
    """The target context: the workload's, else the trained one, capped to stay in fast memory."""
    trained = spec.context_length
    if w.context_length is not None:
        if trained and w.context_length > trained:
            warnings.append(
                f"context {w.context_length} exceeds the model's trained {trained} tokens: quality may drop"
            )
        return w.context_length
    if trained is None:
        warnings.append(f"the model does not state its trained context: using {DEFAULT_CONTEXT}")
        return DEFAULT_CONTEXT
    weights = spec.weight_bytes or 0
    pools = fast_pools(snapshot) or [system_pool(snapshot)]
    if weights + kv_bytes(spec, trained, w.kv_dtype) * w.concurrency <= pools[-1].usable_bytes:
        return trained
    fitting = max_context(spec, pools[-1].usable_bytes, weights, w.concurrency, w.kv_dtype, trained)
    if fitting >= min(DEFAULT_CONTEXT, trained):
        capped = fitting // 256 * 256
        reasons.append(
            f"context capped at {capped} of the trained {trained} tokens so {w.concurrency} sequence(s) fit in memory"
        )
        return capped
    return trained


def _layout(
    engine: str, pool: MemoryPool, fit: str, spec: ModelSpec, w: Workload, s: HardwareSnapshot, context: int
) -> Layout:
    gpus = pool.devices if pool.kind == "vram" else 0
    tp, pp = (gpus, 1) if pool.linked else (1, gpus)
    facts = registry.spec(engine)
    if not facts.tensor_parallel:
        tp, pp = 1, max(gpus, 1)
    gpu_layers = 0
    if pool.kind in ("vram", "unified") and fit == "fast":
        gpu_layers = -1
    elif fit != "fast" and facts.partial_offload and spec.layers and spec.weight_bytes:
        fast = fast_pools(s)
        if fast:
            room = fast[-1].usable_bytes - kv_bytes(spec, context, w.kv_dtype) * w.concurrency
            gpus = fast[-1].devices if fast[-1].kind == "vram" else 0
            gpu_layers = max(0, min(spec.layers, int(room // (spec.weight_bytes / spec.layers))))
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
    )


def _engine_threads(s: HardwareSnapshot) -> int | None:
    """CPU threads for llama.cpp: every core but one, which the gateway keeps for its event loop.

    Measured on a 2-vCPU host (benchmarks/gateway_vs_direct.py): llama.cpp decoded as fast with 1
    thread as with 2, and with 2 the gateway added 6.4 ms to the first token and lost 3 % of the
    decode rate to the contention, against 2.2 ms and 0.3 % with 1.
    """
    cores = s.cpu.physical_cores or s.cpu.logical_cores
    return None if cores is None else max(1, cores - 1)


def _capacity(spec: ModelSpec, pool: MemoryPool, fit: str, lay: Layout, w: Workload, s: HardwareSnapshot) -> Capacity:
    common: dict[str, Any] = {
        "context_length": lay.context_length,
        "concurrency": w.concurrency,
        "kv_dtype": w.kv_dtype,
        "prompt_tokens": w.prompt_tokens,
        "output_tokens": w.output_tokens,
    }
    fast = fast_pools(s)
    if fit != "fast" and lay.gpu_layers > 0 and fast and spec.layers:
        share_in_ram = 1 - lay.gpu_layers / spec.layers
        partial = assess(spec, fast[-1], fit=fit, offload=(share_in_ram, s.cpu.measured_bandwidth_gbps), **common)  # type: ignore[arg-type]
        ram = assess(spec, pool, fit=fit, **common)  # type: ignore[arg-type]
        return ram.model_copy(update={"decode_tokens_per_s": partial.decode_tokens_per_s})
    return assess(spec, pool, fit=fit, tensor_parallel=lay.tensor_parallel, **common)  # type: ignore[arg-type]


def _explain(
    engine: str,
    cap: Capacity,
    lay: Layout,
    pool: MemoryPool,
    s: HardwareSnapshot,
    reasons: list[str],
    warnings: list[str],
) -> None:
    where = {
        "vram": f"{cap.devices_used} GPU(s)",
        "unified": "unified memory",
        "system": "system RAM",
        "split": "GPU memory + system RAM",
    }[cap.memory]
    reasons.append(
        f"weights {_gb(cap.weights_bytes)} + KV {_gb(cap.kv_bytes_per_sequence * cap.concurrency)} "
        f"({cap.concurrency} x {cap.context_length} tokens, {cap.kv_dtype}) = {_gb(cap.required_bytes)}; "
        f"{'fits in' if cap.fit != 'none' else 'exceeds'} {where} ({_gb(cap.usable_bytes)} usable)"
    )
    if lay.gpus > 1:
        if lay.tensor_parallel > 1:
            reasons.append(f"the {lay.gpus} GPUs are joined by NVLink: tensor parallel across {lay.tensor_parallel}")
        elif registry.spec(engine).tensor_parallel:
            reasons.append(
                f"no NVLink between the {lay.gpus} GPUs: "
                f"pipeline parallel ({lay.pipeline_parallel} stages) rather than tensor parallel"
            )
    rate = cap.decode_tokens_per_s
    if rate is not None:
        reasons.append(
            f"decode at most ~{rate:.0f} tokens/s per sequence "
            f"({cap.bandwidth_gbps or 0:.0f} GB/s over {_gb(cap.bytes_per_token)} read per token: "
            f"weights + KV of {cap.sequence_tokens} tokens)"
        )
    if cap.prefill_seconds is not None:
        reasons.append(
            f"prefill of {cap.prompt_tokens} tokens ~{cap.prefill_seconds * 1000:.0f} ms "
            f"at {cap.prefill_efficiency:.0%} of peak FLOPs"
        )
    has_fast = bool(fast_pools(s))
    speed = (
        f"expect at most about {rate:.0f} tokens/s"
        if rate is not None
        else "run `enginegate doctor` to measure RAM bandwidth and estimate the speed"
    )
    if cap.fit == "system" and has_fast:
        offload = f" ({lay.gpu_layers} layers offloaded to the GPU)" if lay.gpu_layers > 0 else ""
        warnings.append(f"the model fits only in system RAM{offload}: {speed}")
    elif cap.fit == "system" and rate is None:
        warnings.append(f"the model runs from system RAM: {speed}")
    elif cap.fit == "none":
        warnings.append(
            f"the model does not fit in memory ({_gb(cap.required_bytes)} needed): "
            "loading will fail or swap; use a smaller quantisation or context"
        )
    if cap.fit == "fast" and cap.max_concurrency < cap.concurrency:
        warnings.append(f"only {cap.max_concurrency} sequences of {cap.context_length} tokens fit at once")
    if s.nvidia and any(g.mig_enabled for g in s.nvidia.gpus):
        warnings.append("MIG is enabled: engines see MIG slices, not whole GPUs, and memory figures above are per GPU")


def plan(
    snapshot: HardwareSnapshot,
    spec: ModelSpec,
    workload: Workload | None = None,
    requested_engine: str = "auto",
    installed: Installed | None = None,
    rules: RuleBook | Path | None = None,
) -> Plan:
    # An engine run as another mode of a planned engine (llama_server of llamacpp) is planned as that one.
    planned_as = registry.spec(requested_engine).plans_as if requested_engine != "auto" else None
    mode = requested_engine if planned_as else None
    requested_engine = planned_as or requested_engine
    w = workload or Workload()
    base_check = installed or is_installed
    def check(engine: str) -> bool:
        return base_check(mode if mode and engine == requested_engine else engine)
    book = rules if isinstance(rules, RuleBook) else load_rules(rules)
    if spec.weight_bytes is None:
        raise ValueError(f"{spec.path}: the weights' size is unknown, so capacity cannot be planned")
    reasons: list[str] = []
    warnings: list[str] = []
    context = _context(spec, w, snapshot, reasons, warnings)
    required = spec.weight_bytes + kv_bytes(spec, context, w.kv_dtype) * w.concurrency
    pool, fit = place(snapshot, required)
    profile = _profile(snapshot, spec, w, fit, context)
    ranked = rank(book, profile)
    rejected: list[Rejection] = []
    chosen: Candidate | None = None
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
        for cand in ranked:
            failed = violations(cand.engine, book.engines[cand.engine], profile, check)
            if not failed:
                chosen = cand
                break
            rejected += failed
            if all(f.constraint == "installed" for f in failed):
                not_installed.append(cand)
    is_present = True
    if chosen is None:
        if not not_installed:
            tried = {r.engine for r in rejected}
            extra = [r for e, n in book.engines.items() if e not in tried for r in violations(e, n, profile, None)]
            raise NoEngineError(spec, rejected + extra)
        chosen = not_installed[0]
        is_present = False
        install = book.engines[chosen.engine].install
        warnings.append(f"{chosen.engine} is the best engine for this host but is not installed: {install}")
    tried = {r.engine for r in rejected} | {chosen.engine}
    for engine, needs in book.engines.items():
        if engine not in tried:
            rejected += violations(engine, needs, profile, None)
    reasons.insert(0, f"{chosen.because} [rule: {chosen.rule}]")
    lay = _layout(chosen.engine, pool, fit, spec, w, snapshot, context)
    cap = _capacity(spec, pool, fit, lay, w, snapshot)
    _explain(chosen.engine, cap, lay, pool, snapshot, reasons, warnings)
    if mode == "llama_server":
        reasons.append("llama.cpp runs as llama-server, its own process: concurrent requests share its slots")
    return Plan(
        engine=mode or chosen.engine,
        options=engine_options(mode or chosen.engine, lay),
        rule=chosen.rule,
        reasons=tuple(reasons),
        warnings=tuple(warnings),
        installed=is_present,
        model=spec.path,
        spec=spec,
        candidates=tuple(ranked),
        rejected=tuple(rejected),
        capacity=cap,
        profile=profile,
    )
