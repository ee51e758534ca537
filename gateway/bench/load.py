"""Load shapes: a closed loop at fixed concurrency, or Poisson arrivals at a fixed rate.

Either stops issuing after `requests` sends or `duration_s` seconds, then waits for every
request in flight: each send ends as exactly one RequestResult, so nothing is dropped.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import aiohttp

from gateway.bench.client import Counter, RequestResult, Target, send
from gateway.bench.workload import PromptSource


@dataclass(frozen=True)
class Level:
    kind: str  # "concurrency", "rate" or (multi-turn sessions only) "arrivals"
    value: float  # workers (sessions in flight), requests per second, or sessions starting per second

    @property
    def label(self) -> str:
        if self.kind == "concurrency":
            return f"c={int(self.value)}"
        if self.kind == "arrivals":
            return f"arrivals={self.value:g}/s"
        return f"rate={self.value:g}/s"

    @property
    def open_loop(self) -> bool:
        return self.kind in ("rate", "arrivals")


def poisson_offsets(rate: float, rng: random.Random) -> Iterator[float]:
    """Arrival times of a Poisson process at `rate` per second, in seconds after the start: the first at
    0, then exponential gaps; the same rng state gives the same times."""
    if rate <= 0:
        raise ValueError("an arrival rate must be positive")
    at = 0.0
    while True:
        yield at
        at += rng.expovariate(rate)


@dataclass(frozen=True)
class Budget:
    requests: int | None = None
    duration_s: float | None = None

    def __post_init__(self) -> None:
        if (self.requests is None) == (self.duration_s is None):
            raise ValueError("give exactly one of requests and duration_s")
        if (self.requests is not None and self.requests < 1) or (self.duration_s is not None and self.duration_s <= 0):
            raise ValueError("the per-level budget must be positive")


@dataclass
class LevelRun:
    level: Level
    results: list[RequestResult]
    duration_s: float
    client_cpu_s: float


OnDone = Callable[[RequestResult], None]


class _Issuer:
    """Hands out request indices until the budget is spent."""

    def __init__(self, budget: Budget, start: float) -> None:
        self.budget = budget
        self.deadline = None if budget.duration_s is None else start + budget.duration_s
        self.issued = 0

    def take(self) -> int | None:
        if self.budget.requests is not None and self.issued >= self.budget.requests:
            return None
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            return None
        self.issued += 1
        return self.issued - 1


async def run_level(session: aiohttp.ClientSession, target: Target, source: PromptSource, level: Level,
                    budget: Budget, seed: int, counter: Counter | None = None, on_done: OnDone | None = None,
                    max_concurrency: int | None = None) -> LevelRun:
    rng = random.Random(seed)  # arrival times; prompts draw from seed and index, so a run repeats exactly
    results: list[RequestResult] = []
    cpu0, start = time.process_time(), time.perf_counter()
    issuer = _Issuer(budget, start)

    async def one(index: int) -> None:
        result = await send(session, target, source.make(random.Random(seed * 1_000_003 + index), index), counter)
        results.append(result)
        if on_done is not None:
            on_done(result)

    if level.kind == "concurrency":
        async def worker() -> None:
            while (index := issuer.take()) is not None:
                await one(index)

        await asyncio.gather(*(worker() for _ in range(int(level.value))))
    elif level.kind == "rate":
        gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None

        async def gated(index: int) -> None:
            if gate is None:
                await one(index)
                return
            async with gate:
                await one(index)

        tasks: list[asyncio.Task[None]] = []
        for offset in poisson_offsets(level.value, rng):
            delay = start + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if (index := issuer.take()) is None:
                break
            tasks.append(asyncio.create_task(gated(index)))
        await asyncio.gather(*tasks)
    else:
        raise ValueError(f"unknown level kind {level.kind!r}")
    return LevelRun(level, results, time.perf_counter() - start, time.process_time() - cpu0)
