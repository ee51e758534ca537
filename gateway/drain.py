"""Graceful drain: what the gateway does between SIGTERM and exit.

    draining: new requests get 503 + Retry-After and /ready says 503 (a load balancer stops
              sending); requests in flight go on.
    expired:  `grace` seconds later, what is still running is ended: each stream with a final
              error event (code `shutting_down`), each non-streaming request with a 503.
    then the server exits (uvicorn closes connections, the lifespan stops the engines).

Concurrency rule: everything runs on the event loop. A request that may have to be ended
registers its task (`register`, then `unregister` when done); at expiry the drain cancels those
tasks, and the code that catches the CancelledError asks `ending()` whether it was the drain (then
it uncancels itself and finishes its response) or a real cancellation (then it re-raises).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.middleware import send_error

log = logging.getLogger("enginegate")

EXEMPT = ("/health", "/ready", "/metrics")
"""Answered while draining: probes and scrapes must keep seeing the truth."""
SHUTTING_DOWN = "shutting_down"


class Drain:
    def __init__(self, grace: float, retry_after: int = 1) -> None:
        self.grace = grace
        self.retry_after = retry_after
        self.draining = False
        self.in_flight = 0
        self._guarded: set[asyncio.Task[object]] = set()
        self._ended: set[asyncio.Task[object]] = set()
        self.on_start: list[Callable[[], None]] = []
        """Called when the drain starts: what never ends by itself (the live request stream) ends then."""

    def register(self, task: asyncio.Task[object] | None = None) -> asyncio.Task[object]:
        """Register `task` (the current one when None) as one the drain may end at expiry; `unregister` it after."""
        task = task or asyncio.current_task()
        assert task is not None
        self._guarded.add(task)
        return task

    def unregister(self, task: asyncio.Task[object]) -> None:
        self._guarded.discard(task)
        self._ended.discard(task)

    def ending(self) -> bool:
        """True in a task the drain is ending (it cancelled it); the caller uncancels and finishes."""
        task = asyncio.current_task()
        if task is None or task not in self._ended:
            return False
        task.uncancel()
        return True

    async def run(self) -> None:
        """Stop admitting, wait up to `grace` for in-flight requests, then end the rest."""
        self.draining = True
        for ending in self.on_start:
            ending()
        loop = asyncio.get_running_loop()
        log.info("draining: %d request(s) in flight, grace %.0fs", self.in_flight, self.grace)
        deadline = loop.time() + self.grace
        while self.in_flight > 0 and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if self.in_flight > 0:
            log.warning("drain grace over: ending %d request(s) still in flight", len(self._guarded))
            for task in list(self._guarded):
                self._ended.add(task)
                task.cancel()
            deadline = loop.time() + 5.0
            while self.in_flight > 0 and loop.time() < deadline:
                await asyncio.sleep(0.05)
        log.info("drained")


class DrainMiddleware:
    """Plain ASGI: counts requests in flight; while draining answers new ones 503 + Retry-After."""

    def __init__(self, app: ASGIApp, drain: Drain) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in EXEMPT:
            await self.app(scope, receive, send)
            return
        if self.drain.draining:
            await send_error(send, 503, "the gateway is shutting down; retry on another instance", SHUTTING_DOWN,
                             [(b"retry-after", str(self.drain.retry_after).encode()), (b"connection", b"close")])
            return
        self.drain.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.in_flight -= 1
