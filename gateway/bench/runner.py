"""A whole bench run: ceiling, warm-up, then every level against every target, interleaved."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from gateway.bench.ceiling import Ceiling, bound_warnings, measure_ceiling
from gateway.bench.client import Counter, RequestResult, Target, make_session
from gateway.bench.load import Budget, Level, LevelRun, run_level
from gateway.bench.sessions import SessionRun, SessionSource, SessionSpec, run_sessions
from gateway.bench.stats import SLO, LevelStats, per_turn, prompt_work, summarize
from gateway.bench.workload import PromptSource


class BenchError(Exception):
    """The run cannot go on (an endpoint unreachable during warm-up, ...)."""


class Progress(Protocol):
    def update(self, n: int = 1) -> object: ...
    def set_postfix_str(self, s: str) -> object: ...
    def close(self) -> None: ...


ProgressFactory = Callable[[str, int | None], Progress]


@dataclass(frozen=True)
class BenchPlan:
    targets: list[Target]
    levels: list[Level]
    source: PromptSource
    slo: SLO = SLO()
    requests: int | None = None  # per level; None with no duration: chosen from the level
    duration_s: float | None = None
    warmup: int = 2
    seed: int = 0
    max_concurrency: int | None = None  # rate mode: cap on requests in flight
    ceiling: bool = True
    sessions: SessionSpec | None = None  # multi-turn sessions instead of independent requests

    def budget(self, level: Level) -> Budget:
        if self.sessions is not None:
            return Budget(requests=self.sessions.requests)
        if self.duration_s is not None:
            return Budget(duration_s=self.duration_s)
        if self.requests is not None:
            return Budget(requests=self.requests)
        if level.kind == "concurrency":
            return Budget(requests=max(16, 4 * int(level.value)))
        return Budget(requests=max(16, math.ceil(10 * level.value)))


@dataclass
class BenchResult:
    plan: BenchPlan
    levels: dict[str, list[LevelStats]]  # target name -> one entry per level, in level order
    ceiling: Ceiling | None
    warnings: list[str] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)
    wall_s: float = 0.0


def level_seed(seed: int, level: int, target: int) -> int:
    """Each level and target draws its own prompts (same lengths, different words): a target that
    shares an engine with another, or a second run, must not hit the engine's prompt cache."""
    return seed * 1_000_003 + level * 1_009 + target


def timing_seed(seed: int, level: int) -> int:
    """Arrival and think times of a level: one for every target, so endpoints compared see the same times."""
    return level_seed(seed, level, 0)


def _connections(plan: BenchPlan) -> int:
    if any(level.open_loop for level in plan.levels) and not plan.max_concurrency:
        return 0  # unlimited: open-loop arrivals must not queue inside the client
    values = [int(level.value) for level in plan.levels if level.kind == "concurrency"]
    return max([*values, plan.max_concurrency or 1, 1])


async def _warm_up(plan: BenchPlan, target: Target, counter: Counter | None) -> None:
    if plan.warmup <= 0:
        return
    level = Level("concurrency", min(plan.warmup, max(1, _connections(plan) or plan.warmup)))
    async with make_session(_connections(plan)) as session:
        run = await run_level(session, target, plan.source, level, Budget(requests=plan.warmup),
                              seed=level_seed(plan.seed, 999, plan.targets.index(target)), counter=counter)
    failed = [r for r in run.results if not r.ok]
    if len(failed) == len(run.results):
        first = failed[0]
        raise BenchError(f"{target.name} ({target.url}): every warm-up request failed: {first.error}: {first.detail}")


def _with_turns(stats: LevelStats, run: SessionRun, spec: SessionSpec) -> LevelStats:
    notes = list(stats.notes)
    if run.ended_early:
        notes.append(f"{stats.label}: {run.ended_early} sessions ended at a failed turn; their {run.unsent} later "
                     "turns were not sent")
    return dataclasses.replace(stats, turns=per_turn(run.results), notes=notes,
                               prompt_work=prompt_work(run.traces, shared=spec.shared_prefix_tokens > 0))


async def run_bench(plan: BenchPlan, counter: Counter | None = None,
                    progress: ProgressFactory | None = None) -> BenchResult:
    if not plan.targets or not plan.levels:
        raise ValueError("a bench plan needs at least one target and one level")
    if plan.sessions is not None and any(level.kind not in ("concurrency", "arrivals") for level in plan.levels):
        raise ValueError("multi-turn sessions take concurrency levels (sessions in flight) or arrival rates "
                         "(sessions starting per second), not request rates")
    if plan.sessions is None and any(level.kind == "arrivals" for level in plan.levels):
        raise ValueError("arrival rates (sessions per second) need multi-turn sessions")
    names = [t.name for t in plan.targets]
    if len(set(names)) != len(names):
        raise ValueError(f"target names must differ: {names}")
    t0 = time.perf_counter()
    ceiling = None
    if plan.ceiling:
        # the same answer length as the workload, so that the per-request cost compares like with like
        ceiling = await measure_ceiling(max(1, min(64, _connections(plan) or 64)), tokens=plan.source.output_len.mean)
    result = BenchResult(plan, {t.name: [] for t in plan.targets}, ceiling)
    if ceiling is not None and not ceiling.client_bound:
        result.warnings.append(
            f"the ceiling run kept the client only {ceiling.client_cpu_fraction:.0%} busy: "
            "the trivial endpoint shared the machine, so the client's true ceiling is higher")
    for target in plan.targets:
        await _warm_up(plan, target, counter)
    for i, level in enumerate(plan.levels):
        # Alternate the order level by level so that drift in the machine hits every target alike.
        order = plan.targets if i % 2 == 0 else list(reversed(plan.targets))
        for target in order:
            seed = level_seed(plan.seed, i, plan.targets.index(target))
            budget = plan.budget(level)
            bar = progress(f"{target.name} {level.label}", budget.requests) if progress else None
            failures = 0

            def done(r: RequestResult, bar: Progress | None = bar) -> None:
                nonlocal failures
                failures += not r.ok
                if bar is not None:
                    bar.update(1)
                    if failures:
                        bar.set_postfix_str(f"errors={failures}")

            async with make_session(_connections(plan)) as session:
                run: LevelRun
                if plan.sessions is not None:
                    run = await run_sessions(session, target, SessionSource(plan.sessions), level, seed,
                                             counter=counter, on_done=done, timing_seed=timing_seed(plan.seed, i))
                else:
                    run = await run_level(session, target, plan.source, level, budget, seed=seed,
                                          counter=counter, on_done=done, max_concurrency=plan.max_concurrency)
            if bar is not None:
                bar.close()
            stats = summarize(level.label, run.results, run.duration_s, plan.slo, run.client_cpu_s)
            if isinstance(run, SessionRun):
                assert plan.sessions is not None
                stats = _with_turns(stats, run, plan.sessions)
            result.levels[target.name].append(stats)
            result.warnings.extend(f"{target.name} {w}" for w in bound_warnings(stats, ceiling))
    result.wall_s = time.perf_counter() - t0
    return result


def bench_sessions(base_url: str, model: str, spec: SessionSpec, *, arrivals_per_s: float | None = None,
                   concurrency: int | None = None, seed: int = 0, api_key: str | None = None, warmup: int = 0,
                   timeout_s: float = 300.0, hold_length: bool = True) -> LevelStats:
    """One multi-turn level against one endpoint, for scripts: sessions arriving at `arrivals_per_s`
    (open loop) or `concurrency` in flight (closed loop; default all). The result carries TTFT
    (`ttft.p50`, `ttft.p90`), `output_tps` and `prompt_work` (computed, minimum, ratio);
    `dataclasses.asdict` makes it the same dict as one level of `enginegate bench --json`."""
    if arrivals_per_s is not None and concurrency is not None:
        raise ValueError("give an arrival rate (open loop) or a concurrency (closed loop), not both")
    level = (Level("arrivals", arrivals_per_s) if arrivals_per_s is not None
             else Level("concurrency", concurrency or spec.sessions))
    source = PromptSource("chat", spec.turn_input, spec.output)  # the warm-up's requests
    target = Target("A", base_url, model, api_key, hold_length=hold_length, timeout_s=timeout_s)
    plan = BenchPlan([target], [level], source, warmup=warmup, seed=seed, ceiling=False, sessions=spec)
    result = asyncio.run(run_bench(plan))
    return result.levels["A"][0]
