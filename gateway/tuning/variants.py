"""What `enginegate tune` measures: the planner's installed candidates, each with the options it is unsure of.

The planner fixes what it can compute (context that fits, GPU layers, tensor parallel sizes) and
guesses the rest from rules of thumb: threads (cores - 1), llama-server slots (= concurrency), the KV
cache type, and on GPU engines the memory fraction and the batch limit. Each candidate is measured
with the plan's options first, then with one uncertain option changed at a time; the list is cut to
what the time budget holds, round-robin over the engines so every candidate gets its planned variant
before any gets a second one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from adapters import registry
from gateway.hardware import HardwareSnapshot
from gateway.planning import NoEngineError, Plan, Workload, plan
from gateway.planning.measured import VariantResult
from gateway.planning.features import SPECULATION_MAX_STREAMS_GPU
from gateway.planning.specs import ModelSpec
from gateway.tuning.calibrate import calibrate, engine_figures

STARTUP_S = {"llamacpp": 4.0, "llama_server": 5.0, "mlx": 6.0, "mlx_server": 8.0}
"""Rough start-up of a gateway with this engine (imports, load, readiness); others: DEFAULT_STARTUP_S."""
DEFAULT_STARTUP_S = 90.0
ASSUMED_EFFICIENCY = 0.4
"""Share of the planner's decode bound assumed reached before anything is measured (0.40 measured here)."""
FALLBACK_DECODE_TOKENS_PER_S = 10.0
ASSUMED_BANDWIDTH_GBPS = 10.0
"""Memory bandwidth assumed for the estimate when the host's is unknown (no `enginegate doctor` run yet)."""
PREFILL_S_PER_TOKEN = 0.002
"""Assumed prefill cost when neither the planner nor a record gives one (CPU, small model)."""
MAX_VARIANTS = 3


Missing = Callable[[str, Mapping[str, Any]], str | None]


def _why_missing(engine: str, options: Mapping[str, Any]) -> str | None:
    return registry.spec(engine).why_missing(options)


def _installed(missing: Missing) -> Callable[[str], bool]:
    return lambda engine: missing(engine, {}) is None


KNOBS = ("threads", "parallel", "kv_cache_type", "gpu_memory_fraction", "max_concurrency")
"""The options a variant's label shows."""
FEATURE_KNOBS = ("spec_type", "cache_ram_mib", "speculative_config", "prefix_caching")
"""The engine's own speed-ups a label shows (None: off, the engine's default)."""


def _shown(value: Any) -> Any:
    if value is None:
        return "off"
    return value.get("method", "on") if isinstance(value, Mapping) else value


def label(options: Mapping[str, Any], planned: bool = False) -> str:
    shown = " ".join([f"{k}={options[k]}" for k in KNOBS if options.get(k) is not None]
                     + [f"{k}={_shown(options[k])}" for k in FEATURE_KNOBS if k in options]) or "defaults"
    return f"{shown} (planned)" if planned else shown


class TuneError(ValueError):
    """Tune cannot run as asked (unknown engine, a budget too small for one candidate); the message says why."""


@dataclass(frozen=True)
class Variant:
    engine: str
    options: dict[str, Any]
    label: str
    estimate_s: float
    predicted_decode: float | None = None
    predicted_prefill: float | None = None
    predicted_aggregate: float | None = None
    bytes_per_token: int | None = None
    problem: str | None = None
    """Why it cannot run (not installed, rejected by a hard constraint): recorded, not started."""
    problem_status: str = "failed"


@dataclass(frozen=True)
class Candidates:
    base: Plan
    variants: list[Variant]
    skipped: list[Variant] = field(default_factory=list)
    """Left out for the budget (recorded as skipped)."""


NGRAM_MODES = ("ngram-simple", "ngram-mod")
"""llama-server's n-gram speculation modes tune compares (ngram-simple: the current context; ngram-mod: a table
that persists across requests)."""
NGRAM_CONFIG = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
"""The n-gram speculation a server engine's "on" variant runs (what the planner plans, see adapters/launch.py)."""


def _feature_alternatives(engine: str, options: Mapping[str, Any], w: Workload) -> list[tuple[str, Any]]:
    """The engine's own speed-ups the planner is least sure of: speculation on/off and its mode, the prompt cache."""
    alternatives: list[tuple[str, Any]] = []
    spec_type = options.get("spec_type")
    if spec_type is not None:
        alternatives.append(("spec_type", "none" if spec_type != "none" else "ngram-simple"))
        if spec_type in NGRAM_MODES:  # the other n-gram mode
            alternatives.append(("spec_type", next(m for m in NGRAM_MODES if m != spec_type)))
    if "speculative_config" in options:
        alternatives.append(("speculative_config", None))
    elif "max_concurrency" in options and registry.spec(engine).speculation and w.concurrency <= SPECULATION_MAX_STREAMS_GPU:
        alternatives.append(("speculative_config", NGRAM_CONFIG))
    if options.get("cache_ram_mib"):
        alternatives.append(("cache_ram_mib", 0))
    if options.get("prefix_caching"):
        alternatives.append(("prefix_caching", False))
    return alternatives


def _uncertain(engine: str, options: Mapping[str, Any], snapshot: HardwareSnapshot, w: Workload) -> list[tuple[str, Any]]:
    """(option, alternative value) pairs, most promising first: the speed-ups first where the workload copies its
    prompts or shares prefixes (their gain depends on the text), after the thread and slot counts otherwise."""
    features = _feature_alternatives(engine, options, w)
    copied = w.output_copies_prompt or w.shared_prefix
    alternatives: list[tuple[str, Any]] = list(features) if copied else []
    cores = snapshot.cpu.logical_cores
    if "threads" in options and cores and options.get("gpu_layers", 0) in (0, None):
        planned = options.get("threads")
        for value in (cores, max(1, cores // 2)):
            if value != planned:
                alternatives.append(("threads", value))
    if engine == "llama_server":
        slots = int(options.get("parallel") or 1)
        for value in ((1, w.concurrency * 2) if w.concurrency > 1 else (2,)):
            if value != slots:
                alternatives.append(("parallel", value))
        if options.get("kv_cache_type") in ("f16", None):
            alternatives.append(("kv_cache_type", "q8_0"))
    if "gpu_memory_fraction" in options:
        fraction = float(options["gpu_memory_fraction"])
        alternatives.append(("gpu_memory_fraction", round(max(0.5, fraction - 0.1), 2)))
    if "max_concurrency" in options:
        alternatives.append(("max_concurrency", int(options["max_concurrency"]) * 2))
    if not copied:
        alternatives += features
    return _unique(alternatives)


def _unique(pairs: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The pairs without repeats, first kept (values may be mappings, so compared as JSON)."""
    seen: set[tuple[str, str]] = set()
    out = []
    for key, value in pairs:
        marker = (key, json.dumps(value, sort_keys=True))
        if marker not in seen:
            seen.add(marker)
            out.append((key, value))
    return out


def _with(options: Mapping[str, Any], key: str, value: Any) -> dict[str, Any]:
    changed = {**options, key: value}
    if key == "parallel" and "context_length" in options and "--kv-unified" in options.get("extra_args", ()):
        # the unified cache is sized for the planned slots; keep each slot's share
        per_slot = int(options["context_length"]) // max(1, int(options.get("parallel") or 1))
        changed["context_length"] = max(int(options["context_length"]), per_slot * int(value))
    return changed


def _expected(p: Plan, usable: Sequence[Sequence[VariantResult]]) -> tuple[float | None, float | None]:
    """Decode tokens/s and prefill seconds to expect: calibrated by earlier records, else a share of the
    planner's bound, else ASSUMED_BANDWIDTH_GBPS over the bytes read per token."""
    figures = engine_figures(p.engine, usable, p.options)
    if figures is not None:
        p = calibrate(p, figures)
    cap = p.capacity
    if cap is None:
        return None, None
    if p.calibration is not None and p.calibration.decode_tokens_per_s:
        decode = cap.decode_tokens_per_s
    elif cap.decode_tokens_per_s:
        decode = cap.decode_tokens_per_s * ASSUMED_EFFICIENCY
    else:
        decode = ASSUMED_BANDWIDTH_GBPS * 1e9 / cap.bytes_per_token * ASSUMED_EFFICIENCY
    return decode, cap.prefill_seconds


def estimate_s(engine: str, decode: float | None, prefill: float | None, w: Workload, requests: int,
               levels: Sequence[int]) -> float:
    """Seconds to start, warm up and measure one variant, pessimistic (requests served one at a time)."""
    rate = decode if decode else FALLBACK_DECODE_TOKENS_PER_S
    first = prefill if prefill is not None else w.prompt_tokens * PREFILL_S_PER_TOKEN
    per_request = first + w.output_tokens / rate
    return STARTUP_S.get(engine, DEFAULT_STARTUP_S) + per_request * (1 + requests * len(levels)) + 1.0


def _engines(base: Plan, requested: Sequence[str] | None) -> list[str]:
    """The ranked candidates that passed the hard constraints, each followed by its other serving modes."""
    if requested:
        return list(dict.fromkeys(requested))
    failed = {r.engine for r in base.rejected if r.constraint != "installed"}
    ranked = [c.engine for c in base.candidates if c.engine not in failed]
    order = [base.engine]
    for engine in ranked:
        modes = [s.name for s in registry.specs() if s.plans_as == engine]
        order += [engine, *modes]
    return [e for e in dict.fromkeys(order) if registry.spec(e).local_weights]


def candidates(snapshot: HardwareSnapshot, spec: ModelSpec, w: Workload, *, engines: Sequence[str] | None,
               budget_s: float, requests: int, levels: Sequence[int],
               usable: Sequence[Sequence[VariantResult]] = (), max_variants: int = MAX_VARIANTS,
               missing: Missing | None = None) -> Candidates:
    """The variants to measure in order, cut to `budget_s`; raises TuneError when not even one fits.

    usable: earlier records' results on this host (their calibration sharpens the time estimates);
    missing(engine, options): why the engine cannot start here (None: it can); default: the engine's spec.
    """
    missing = missing or _why_missing
    installed = _installed(missing)
    known = set(registry.names())
    unknown = [e for e in engines or () if e not in known]
    if unknown:
        raise TuneError(f"--engines: unknown engine(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    try:
        base = plan(snapshot, spec, w, installed=installed)
    except NoEngineError as exc:
        if not engines:
            raise TuneError(str(exc)) from exc
        base = None  # type: ignore[assignment]
    per_engine: list[list[Variant]] = []
    for engine in _engines(base, engines) if base is not None else list(dict.fromkeys(engines or ())):
        per_engine.append(_engine_variants(engine, snapshot, spec, w, requests, levels, usable, missing)[:max_variants])
    if base is None:
        base = plan(snapshot, spec, w, requested_engine=per_engine[0][0].engine, installed=installed)
    ordered: list[Variant] = []
    for depth in range(max(map(len, per_engine), default=0)):
        ordered += [vs[depth] for vs in per_engine if depth < len(vs)]
    runnable = [v for v in ordered if v.problem is None]
    if runnable and runnable[0].estimate_s > budget_s:
        v = runnable[0]
        raise TuneError(f"--budget-seconds {budget_s:g} is too small for one candidate: {v.engine} ({v.label}) needs "
                        f"about {v.estimate_s:.0f} s to start and answer {requests} request(s) per level of "
                        f"{w.prompt_tokens} -> {w.output_tokens} tokens; give at least {v.estimate_s:.0f}")
    chosen: list[Variant] = []
    skipped: list[Variant] = []
    spent = 0.0
    for v in ordered:
        if v.problem is not None:
            chosen.append(v)
        elif spent + v.estimate_s <= budget_s:
            chosen.append(v)
            spent += v.estimate_s
        else:
            skipped.append(v)
    return Candidates(base, chosen, skipped)


def _engine_variants(engine: str, snapshot: HardwareSnapshot, spec: ModelSpec, w: Workload, requests: int,
                     levels: Sequence[int], usable: Sequence[Sequence[VariantResult]],
                     missing: Missing) -> list[Variant]:
    try:
        p = plan(snapshot, spec, w, requested_engine=engine, installed=_installed(missing))
    except (NoEngineError, ValueError) as exc:
        return [Variant(engine, {}, "-", 0.0, problem=f"cannot be planned here: {exc}")]
    why = missing(engine, p.options)
    if why is not None:
        return [Variant(engine, p.options, label(p.options, planned=True), 0.0, problem=why,
                        problem_status="not_installed")]
    failed = [w_ for w_ in p.warnings if w_.startswith(f"{engine} was requested but")]
    if failed:
        return [Variant(engine, p.options, label(p.options, planned=True), 0.0, problem="; ".join(failed))]
    cap = p.capacity
    bound = cap.decode_tokens_per_s if cap else None
    decode, prefill = _expected(p, usable)
    cost = estimate_s(engine, decode, prefill, w, requests, levels)
    common = {"predicted_decode": bound, "predicted_prefill": cap.prefill_seconds if cap else None,
              "predicted_aggregate": cap.aggregate_tokens_per_s if cap else None,
              "bytes_per_token": cap.bytes_per_token if cap else None}
    out = [Variant(engine, p.options, label(p.options, planned=True), cost, **common)]
    for key, value in _uncertain(engine, p.options, snapshot, w):
        options = _with(p.options, key, value)
        out.append(Variant(engine, options, label(options), cost, **common))
    return out
