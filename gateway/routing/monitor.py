"""Active health: poll each replica's readiness and its engine's own load, and follow its reported capacity.

One task per multi-replica backend, started by `Backend.start()` and stopped by `Backend.stop()`.
Each poll is bounded in time, so a hung engine delays nothing but its own entry. A supervised
engine's crash is also seen at once, without polling, through `Replica.down()`.

A replica whose breaker is open is polled sooner (health.probe_delay: from `PROBE_INITIAL_S` after
it opened, doubling up to the interval or `PROBE_CEILING_S`), so it closes when its engine is ready
again with no traffic at all, and `/ready` follows the engine. The monitor looks for newly opened
breakers every `PROBE_INITIAL_S`; the polls are its only I/O, the breaker's methods its only writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from gateway.routing import capacity
from gateway.routing.health import PROBE_INITIAL_S, BreakerState, probe_delay
from gateway.routing.pool import Replica

log = logging.getLogger("enginegate.routing")
POLL_TIMEOUT_S = 5.0


async def follow_capacity(replica: Replica) -> None:
    """Take the slot count the engine reports, where nobody set it (the user's and the launch's win)."""
    if replica.capacity_from != "engine default":
        return
    try:
        slots = await asyncio.wait_for(capacity.reported(replica.adapter), POLL_TIMEOUT_S)
    except TimeoutError:
        return
    if slots is not None:
        replica.admission.resize(slots)
        replica.capacity_from = "engine"


async def poll(replica: Replica) -> None:
    """One active check: readiness into the breaker, the engine's running/waiting/KV use into the replica."""
    try:
        health = await asyncio.wait_for(replica.adapter.health(), POLL_TIMEOUT_S)
        ready, detail = health.ready, health.detail
    except Exception as exc:  # noqa: BLE001 - a failing check is a not-ready answer, whatever it raised
        ready, detail = False, f"{type(exc).__name__}: {exc}"
    replica.breaker.readiness(ready, detail, replica.adapter.incarnation())
    if not ready:
        replica.engine_running = replica.engine_waiting = replica.kv_usage = None
        return
    try:
        stats = await asyncio.wait_for(replica.adapter.engine_stats(), POLL_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - stats are optional
        stats = None
    if stats is not None:
        replica.engine_running = stats.requests_running
        replica.engine_waiting = stats.requests_waiting
        replica.kv_usage = stats.kv_cache_usage_ratio


class HealthMonitor:
    def __init__(self, replicas: Sequence[Replica], interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.replicas = replicas
        self.interval = interval
        self.clock = clock
        self._task: asyncio.Task[None] | None = None
        self._due = [0.0] * len(replicas)
        self._misses = [0] * len(replicas)
        """Polls in a row that found the replica's breaker open (its backoff)."""
        self._opens = [r.breaker.opens for r in replicas]

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="enginegate-health")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def tick(self) -> None:
        """Poll the replicas that are due, and schedule each one's next poll."""
        now = self.clock()
        for i, replica in enumerate(self.replicas):
            if replica.breaker.opens != self._opens[i]:  # opened by its requests since: probe it soon
                self._opens[i], self._misses[i] = replica.breaker.opens, 0
                self._due[i] = min(self._due[i], replica.breaker.opened_at + PROBE_INITIAL_S)
        due = [i for i in range(len(self.replicas)) if self._due[i] <= now]
        results = await asyncio.gather(*(poll(self.replicas[i]) for i in due), return_exceptions=True)
        now = self.clock()
        for i, result in zip(due, results, strict=True):
            if isinstance(result, Exception):  # never let the monitor die silently
                log.error("replica %s health check failed", self.replicas[i].name, exc_info=result)
            breaker = self.replicas[i].breaker
            self._opens[i] = breaker.opens
            self._due[i] = now + probe_delay(breaker.state, self._misses[i], self.interval)
            self._misses[i] = self._misses[i] + 1 if breaker.state is BreakerState.OPEN else 0

    async def _run(self) -> None:
        while True:
            await self.tick()
            wait = min(self._due, default=self.clock() + self.interval) - self.clock()
            await asyncio.sleep(max(0.0, min(wait, PROBE_INITIAL_S, self.interval)))
