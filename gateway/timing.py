"""Where a request's time goes: waiting for an engine slot, inside the engine, or in the gateway.

`MetricsMiddleware` puts one `RequestTiming` in the ASGI scope's state; the serving flow adds
the time it spends queued for a slot and inside the adapter (the call, then every step of its
stream). The gateway's own overhead is what is left: total - queued - upstream.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from starlette.types import Scope

TIMING_STATE_KEY = "enginegate.timing"
T = TypeVar("T")


@dataclass(slots=True)
class RequestTiming:
    upstream: float = 0.0
    """Seconds spent inside the adapter: its call and, for a stream, waiting for each event."""
    queued: float = 0.0
    """Seconds spent waiting for a free engine slot (admission)."""

    def overhead(self, total: float) -> float:
        return max(0.0, total - self.upstream - self.queued)


def request_timing(scope: Scope) -> RequestTiming:
    """The request's timing record; a detached one when no middleware installed it (tests)."""
    state = scope.setdefault("state", {})
    timing = state.get(TIMING_STATE_KEY)
    if not isinstance(timing, RequestTiming):
        timing = state[TIMING_STATE_KEY] = RequestTiming()
    return timing


class TimedStream(Generic[T]):
    """Wraps an adapter's async iterator; the time spent awaiting each item counts as upstream."""

    def __init__(self, inner: AsyncIterator[T], timing: RequestTiming) -> None:
        self._inner = inner
        self._timing = timing

    def __aiter__(self) -> TimedStream[T]:
        return self

    async def __anext__(self) -> T:
        started = time.perf_counter()
        try:
            return await self._inner.__anext__()
        finally:
            self._timing.upstream += time.perf_counter() - started

    async def aclose(self) -> None:
        close: Any = getattr(self._inner, "aclose", None)
        if close is not None:
            await close()
