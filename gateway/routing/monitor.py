"""Active health: poll each replica's readiness and its engine's own load, and follow its reported capacity.

One task per multi-replica backend, started by `Backend.start()` and stopped by `Backend.stop()`.
Each poll is bounded in time, so a hung engine delays nothing but its own entry. A supervised
engine's crash is also seen at once, without polling, through `Replica.down()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from gateway.routing import capacity
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
    replica.breaker.readiness(ready, detail)
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
    def __init__(self, replicas: Sequence[Replica], interval: float) -> None:
        self.replicas = replicas
        self.interval = interval
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="enginegate-health")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.gather(*(poll(r) for r in self.replicas))
            except Exception:  # never let the monitor die silently
                log.exception("replica health check failed")
            await asyncio.sleep(self.interval)
