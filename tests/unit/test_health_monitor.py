"""The health monitor probes an open breaker on its own: sooner than the closed poll, with backoff, over a fake clock."""

from __future__ import annotations

from collections.abc import Callable

from adapters.base import EngineError, Health
from gateway.routing import Admission
from gateway.routing.health import PROBE_INITIAL_S, Breaker, BreakerState
from gateway.routing.monitor import HealthMonitor
from gateway.routing.pool import Replica
from tests.fakes import EchoAdapter

INTERVAL = 2.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Supervised(EchoAdapter):
    """An engine whose readiness and process incarnation the test sets; counts the probes."""

    def __init__(self) -> None:
        super().__init__()
        self.ready = True
        self.pid = 1
        self.probes = 0

    async def health(self) -> Health:
        self.probes += 1
        return Health(self.ready, "ready" if self.ready else "starting")

    def incarnation(self) -> object:
        return (self.pid, self.pid - 1)


def replicas(clock: Clock, open_seconds: float = 60.0) -> tuple[list[Replica], list[Supervised]]:
    adapters = [Supervised(), Supervised()]
    return [Replica(a, Admission(None), str(i), Breaker(1, open_seconds, clock)) for i, a in enumerate(adapters)], adapters


async def run_until(monitor: HealthMonitor, clock: Clock, until: float, done: Callable[[], bool] = lambda: False,
                    step: float = 0.05) -> float | None:
    """Tick every `step` of fake time up to `until` (inclusive); the time `done` first held, if it did."""
    while clock.now <= until + 1e-9:
        await monitor.tick()
        if done():
            return clock.now
        clock.now = round(clock.now + step, 6)
    return None


async def test_an_engine_restarted_with_no_traffic_closes_within_a_probe() -> None:
    clock = Clock()
    pool, (a, b) = replicas(clock)
    monitor = HealthMonitor(pool, INTERVAL, clock)
    await monitor.tick()  # both polled once, both ready
    a.ready = False  # crashed: its supervisor restarts it
    await run_until(monitor, clock, clock.now + INTERVAL)
    assert pool[0].breaker.state is BreakerState.OPEN
    a.ready, a.pid = True, 2
    ready_at = clock.now
    b_probes = b.probes
    closed_at = await run_until(monitor, clock, clock.now + 10, lambda: pool[0].breaker.state is BreakerState.CLOSED)
    assert closed_at is not None and closed_at - ready_at <= INTERVAL  # never later than the closed poll
    assert b.probes - b_probes <= 1  # the healthy one is polled at the interval only


async def test_an_open_breaker_is_probed_at_doubling_delays_up_to_the_interval() -> None:
    clock = Clock()
    pool, (a, b) = replicas(clock)
    monitor = HealthMonitor(pool, INTERVAL, clock)
    a.ready = False
    start = clock.now
    await run_until(monitor, clock, start + 10.0)
    # at 0, 0.25, 0.75, 1.75, then every 2 s: 3.75, 5.75, 7.75, 9.75
    assert a.probes == 8 and b.probes == 6  # the closed one at 0, 2, 4, 6, 8, 10
    assert pool[0].breaker.state is BreakerState.OPEN


async def test_failures_opened_by_requests_are_probed_at_once_and_a_new_process_closes_them() -> None:
    clock = Clock()
    pool, (a, _) = replicas(clock)
    monitor = HealthMonitor(pool, INTERVAL, clock)
    await monitor.tick()
    clock.now += 0.1
    pool[0].breaker.record(EngineError("reset", 502, "engine_reset"), a.incarnation())
    assert pool[0].breaker.state is BreakerState.OPEN
    a.pid = 2  # the supervisor restarted it
    opened = clock.now
    closed_at = await run_until(monitor, clock, clock.now + INTERVAL, lambda: pool[0].breaker.state is BreakerState.CLOSED)
    assert closed_at is not None and closed_at - opened <= PROBE_INITIAL_S + 0.05 and a.probes == 2


async def test_a_ready_engine_that_failed_requests_half_opens_after_open_seconds_with_no_traffic() -> None:
    clock = Clock()
    pool, (a, _) = replicas(clock, open_seconds=5.0)
    monitor = HealthMonitor(pool, INTERVAL, clock)
    pool[0].breaker.record(EngineError("engine error 500: boom", 502), a.incarnation())
    opened = clock.now
    half_at = await run_until(monitor, clock, opened + 10, lambda: pool[0].breaker.state is not BreakerState.OPEN)
    assert half_at is not None and 5.0 <= half_at - opened <= 5.0 + INTERVAL
    assert pool[0].breaker.state is BreakerState.HALF_OPEN and pool[0].candidate().probe


async def test_with_a_long_interval_an_open_breaker_is_still_probed_every_two_seconds() -> None:
    clock = Clock()
    pool, (a, b) = replicas(clock)
    monitor = HealthMonitor(pool, 10.0, clock)
    await monitor.tick()
    clock.now += 0.5
    pool[0].breaker.record(EngineError("reset", 502, "engine_reset"), a.incarnation())  # same process: it cools down
    a.ready = False  # and it is restarting
    start, a_probes, b_probes = clock.now, a.probes, b.probes
    await run_until(monitor, clock, start + 9.0)
    # opened at +0: probed at +0.25, then 0.25, 0.5, 1 and 2 s later: +0.5, +1, +2, +4, +6, +8 (PROBE_CEILING_S apart)
    assert a.probes - a_probes == 7 and b.probes == b_probes  # the closed one waits out its 10 s
    a.ready, a.pid = True, 2
    closed_at = await run_until(monitor, clock, clock.now + 5, lambda: pool[0].breaker.state is BreakerState.CLOSED)
    assert closed_at is not None and closed_at - (start + 9.0) <= 2.0
