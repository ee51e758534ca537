"""One tune run: candidates, each measured in turn within the budget, ranked into a record."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gateway.bench import SLO
from gateway.hardware import HardwareSnapshot
from gateway.planning import Workload, load_spec
from gateway.planning.measured import VariantResult
from gateway.tuning.fingerprint import engine_version, host_fingerprint, model_identity
from gateway.tuning.lookup import lookup
from gateway.tuning.record import TuneRecord
from gateway.tuning.runner import Say, measure
from gateway.tuning.variants import MAX_VARIANTS, Variant, candidates

START_TIMEOUT_S = 300.0
OVERRUN_S = 10.0
"""How far past the budget a running variant may go before it is stopped."""


@dataclass(frozen=True)
class TuneRequest:
    model: Path
    workload: Workload
    budget_s: float
    engines: Sequence[str] | None = None
    requests: int | None = None
    """Per level; None: max(4, 2 x the workload's concurrency)."""
    slo: SLO | None = None
    """None: TPOT within the workload's decode_tokens_per_s (default 10 tokens/s, i.e. 100 ms)."""
    seed: int = 0
    max_variants: int = MAX_VARIANTS

    def levels(self) -> list[int]:
        return sorted({1, self.workload.concurrency})

    def per_level(self) -> int:
        return self.requests or max(4, 2 * self.workload.concurrency)

    def goodput_slo(self) -> SLO:
        if self.slo is not None:
            return self.slo
        return SLO(tpot=1.0 / (self.workload.decode_tokens_per_s or 10.0))


def score(r: VariantResult) -> tuple[float, float]:
    """Goodput at the workload's concurrency first (requests/s within the SLOs), then output tokens/s."""
    good = r.goodput_rps if r.goodput_rps is not None else (r.request_rate or 0.0)
    return good, r.output_tokens_per_s or 0.0


def rank(results: Sequence[VariantResult]) -> tuple[VariantResult, ...]:
    order = {"ok": 0, "failed": 1, "not_installed": 2, "skipped": 3}
    ok = sorted((r for r in results if r.ok), key=score, reverse=True)
    rest = sorted((r for r in results if not r.ok), key=lambda r: order[r.status])
    return (*ok, *rest)


def _unmeasured(v: Variant, status: str, reason: str) -> VariantResult:
    return VariantResult(engine=v.engine, label=v.label, options=v.options, status=status, reason=reason,  # type: ignore[arg-type]
                         predicted_decode_tokens_per_s=v.predicted_decode, predicted_prefill_s=v.predicted_prefill,
                         predicted_aggregate_tokens_per_s=v.predicted_aggregate,
                         bytes_per_token=v.bytes_per_token)


async def tune(snapshot: HardwareSnapshot, req: TuneRequest, say: Say) -> TuneRecord:
    t0 = time.perf_counter()
    spec = load_spec(req.model)
    w = req.workload
    earlier = lookup(snapshot, req.model, w).usable  # calibrates the time estimates
    cands = candidates(snapshot, spec, w, engines=req.engines, budget_s=req.budget_s, requests=req.per_level(),
                       levels=req.levels(), usable=earlier, max_variants=req.max_variants)
    runnable = [v for v in cands.variants if v.problem is None]
    say(f"tune: {len(runnable)} variant(s) to measure within {req.budget_s:g} s "
        f"({', '.join(dict.fromkeys(v.engine for v in cands.variants))}); plan predicts {cands.base.engine}")
    results: list[VariantResult] = []
    took: dict[str, float] = {}  # what a variant of each engine really took, once one has run
    for i, v in enumerate(cands.variants, 1):
        if v.problem is not None:
            say(f"[{i}/{len(cands.variants)}] {v.engine} {v.label}: {v.problem_status.replace('_', ' ')}: {v.problem}")
            results.append(_unmeasured(v, v.problem_status, v.problem))
            continue
        left = req.budget_s - (time.perf_counter() - t0)
        need = max(v.estimate_s, took.get(v.engine, 0.0))
        if need > left:
            say(f"[{i}/{len(cands.variants)}] {v.engine} {v.label}: skipped, {left:.0f} s of budget left, needs ~{need:.0f} s")
            results.append(_unmeasured(v, "skipped", f"budget spent: {max(left, 0):.0f} s left, needs ~{need:.0f} s"))
            continue
        say(f"[{i}/{len(cands.variants)}] {v.engine} {v.label}: starting (~{need:.0f} s)")
        # a variant slower than its estimate is stopped when the budget runs out (its gateway stopped too)
        cap = max(left, need) + OVERRUN_S
        started = time.perf_counter()
        try:
            r = await asyncio.wait_for(
                measure(v, req.model, w, slo=req.goodput_slo(), requests=req.per_level(), levels=req.levels(),
                        start_timeout_s=min(START_TIMEOUT_S, max(30.0, left)), seed=req.seed + i, say=say,
                        params_active=spec.params_active),
                timeout=cap)
        except TimeoutError:
            r = _unmeasured(v, "failed", f"not done within the {cap:.0f} s the budget had left (estimated "
                                         f"~{need:.0f} s): slower than the budget allows")
            r = r.model_copy(update={"wall_s": round(time.perf_counter() - started, 1)})
        took[v.engine] = max(took.get(v.engine, 0.0), r.wall_s or 0.0)
        if r.ok:
            alone = f"{r.decode_tokens_per_s:.1f} tokens/s alone, " if r.decode_tokens_per_s else ""
            say(f"  -> {alone}{r.output_tokens_per_s or 0:.1f} tokens/s at c={w.concurrency}, "
                f"TTFT p50 {(r.ttft_p50_s or 0) * 1000:.0f} ms, peak memory {(r.peak_memory_bytes or 0) / 2**20:.0f} MiB"
                + (f" ({r.reason})" if r.reason else ""))
        else:
            say(f"  -> failed: {r.reason}")
        results.append(r)
    for v in cands.skipped:
        results.append(_unmeasured(v, "skipped", f"left out: the budget of {req.budget_s:g} s holds "
                                                 f"{len(runnable)} variant(s) at ~{v.estimate_s:.0f} s each"))
    engines = sorted({r.engine for r in results if r.status in ("ok", "failed")})
    return TuneRecord(
        host=host_fingerprint(snapshot),
        model=model_identity(req.model),
        workload=w,
        slo={"ttft": req.goodput_slo().ttft, "tpot": req.goodput_slo().tpot, "e2e": req.goodput_slo().e2e},
        engine_versions={e: engine_version(e) for e in engines},
        planned={"engine": cands.base.engine, "options": cands.base.options},
        results=rank(results),
        budget_s=req.budget_s,
        wall_s=round(time.perf_counter() - t0, 1),
    )
