"""Per host and engine: what tune records measured, as figures the planner's formulas can take.

The planner bounds decode by bandwidth / bytes read per token and prefill by FLOPs. A record turns
each into an effective figure for that engine on this host: effective bandwidth = measured tokens/s x
bytes per token, effective prefill FLOP/s = 2 x active params x prompt tokens / measured prefill time.
Put back into the same formulas they predict other models and workloads on this host and engine.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.planning import Plan
from gateway.planning.measured import Calibration, VariantResult

RECENT = 5
"""Records per engine that count (the newest); their median resists one noisy run."""


@dataclass(frozen=True)
class EngineFigures:
    engine: str
    records: int
    bandwidth_gbps: float | None
    prefill_tflops: float | None
    aggregate_share: float | None = None
    """Tokens/s measured over several streams / the planner's aggregate bound for them."""


SPEED_OPTIONS = ("threads", "gpu_layers", "kv_cache_type", "tensor_parallel", "pipeline_parallel", "quantization",
                 "kv_cache_dtype")
"""Options that change one sequence's speed; a measurement counts for a plan only where these agree."""


def best_variant(results: Iterable[VariantResult], engine: str,
                 options: Mapping[str, Any] | None = None) -> VariantResult | None:
    """In one record, the engine's measured variant that runs as the plan would (same speed options),
    else its fastest one (the options tune recommends for it)."""
    ok = [r for r in results if r.ok and r.engine == engine and r.decode_tokens_per_s]
    if options is not None:
        same = [r for r in ok if all(r.options.get(k) == options.get(k) for k in SPEED_OPTIONS)]
        ok = same or ok
    return max(ok, key=lambda r: r.decode_tokens_per_s or 0.0, default=None)


def _bandwidth(r: VariantResult) -> float | None:
    if r.decode_tokens_per_s and r.bytes_per_token:
        return r.decode_tokens_per_s * r.bytes_per_token / 1e9
    return None


def _prefill_tflops(r: VariantResult) -> float | None:
    if r.prefill_s and r.params_active and r.prompt_tokens:
        return 2 * r.params_active * r.prompt_tokens / r.prefill_s / 1e12
    return None


def _aggregate_share(r: VariantResult) -> float | None:
    if r.concurrency > 1 and r.output_tokens_per_s and r.predicted_aggregate_tokens_per_s:
        return r.output_tokens_per_s / r.predicted_aggregate_tokens_per_s
    return None


def engine_figures(engine: str, per_record: Iterable[Iterable[VariantResult]],
                   options: Mapping[str, Any] | None = None) -> EngineFigures | None:
    """Figures from the newest RECENT records (each given as its results, newest first)."""
    best = [b for results in per_record if (b := best_variant(results, engine, options)) is not None][:RECENT]
    bandwidths = [x for b in best if (x := _bandwidth(b)) is not None]
    flops = [x for b in best if (x := _prefill_tflops(b)) is not None]
    shares = [x for b in best if (x := _aggregate_share(b)) is not None]
    if not bandwidths and not flops:
        return None
    return EngineFigures(engine, len(best), statistics.median(bandwidths) if bandwidths else None,
                         statistics.median(flops) if flops else None,
                         statistics.median(shares) if shares else None)


def calibrate(plan: Plan, figures: EngineFigures) -> Plan:
    """The plan with its decode and prefill predictions from the measured figures (the bounds kept beside)."""
    cap = plan.capacity
    if cap is None:
        return plan
    update: dict[str, float | None] = {}
    decode = None
    if figures.bandwidth_gbps and cap.bytes_per_token:
        decode = figures.bandwidth_gbps * 1e9 / cap.bytes_per_token
        update["decode_tokens_per_s"] = decode
    aggregate = None
    if cap.aggregate_tokens_per_s is not None and cap.concurrency > 1:
        # several streams: the measured share of the batched bound; else the bandwidth's scale
        if figures.aggregate_share is not None:
            aggregate = cap.aggregate_tokens_per_s * figures.aggregate_share
        elif figures.bandwidth_gbps and cap.bandwidth_gbps:
            aggregate = cap.aggregate_tokens_per_s * figures.bandwidth_gbps / cap.bandwidth_gbps
    if aggregate is not None:
        update["aggregate_tokens_per_s"] = aggregate
    prefill = None
    params = plan.spec.params_active if plan.spec is not None else None
    if figures.prefill_tflops and params and cap.prompt_tokens:
        prefill = 2 * params * cap.prompt_tokens / (figures.prefill_tflops * 1e12)
        update["prefill_seconds"] = prefill
    if not update:
        return plan
    calibration = Calibration(
        engine=figures.engine,
        records=figures.records,
        effective_bandwidth_gbps=figures.bandwidth_gbps,
        bound_decode_tokens_per_s=cap.decode_tokens_per_s,
        decode_tokens_per_s=decode,
        aggregate_share=figures.aggregate_share,
        bound_aggregate_tokens_per_s=cap.aggregate_tokens_per_s if aggregate is not None else None,
        aggregate_tokens_per_s=aggregate,
        effective_prefill_tflops=figures.prefill_tflops,
        bound_prefill_s=cap.prefill_seconds,
        prefill_s=prefill,
    )
    return plan.model_copy(update={"capacity": cap.model_copy(update=update), "calibration": calibration})
