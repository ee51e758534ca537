"""The recent requests: a bounded ring of finished records, and the live subscriptions to new ones.

Concurrency rule: everything runs on the event loop and nothing here awaits while it holds state.
`record` (the hot path, once per request) is one deque append plus one list append per live
subscriber; a subscriber that falls `SUBSCRIBER_BACKLOG` records behind is ended (marked `lagged`),
never waited for. `close` (the drain's start, the lifespan's end) ends every subscription and
refuses new ones, so a live stream never holds the gateway's shutdown.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from gateway.recent.facts import RequestFacts
from gateway.tenancy.limits import Decision

SUBSCRIBER_BACKLOG = 1000
MAX_TENANTS = 10_000


class Subscription:
    """One live reader's queue of records not yet sent."""

    __slots__ = ("_wake", "ended", "items", "lagged")

    def __init__(self) -> None:
        self.items: list[RequestFacts] = []
        self.ended = False
        self.lagged = False
        self._wake = asyncio.Event()

    def push(self, facts: RequestFacts) -> None:
        if len(self.items) >= SUBSCRIBER_BACKLOG:
            self.lagged = True
            self.end()
            return
        self.items.append(facts)
        self._wake.set()

    def end(self) -> None:
        self.ended = True
        self._wake.set()

    async def next(self, timeout: float | None = None) -> list[RequestFacts] | None:
        """The records since the last call ([] when `timeout` passed with none), None once ended."""
        if not self.items and not self.ended:
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                return []
        if self.ended:
            return None
        items, self.items = self.items, []
        return items


@dataclass(frozen=True, slots=True)
class LimitsSeen:
    """A tenant's limits and counters as its last request through this gateway found them."""

    at: float
    decision: Decision


class RecentRequests:
    def __init__(self, size: int = 1000) -> None:
        self.size = size
        self._rows: deque[RequestFacts] = deque(maxlen=size)
        self._subs: list[Subscription] = []
        self.closed = False
        self.limits: dict[str, LimitsSeen] = {}

    def record(self, facts: RequestFacts, decision: Decision | None = None) -> None:
        self._rows.append(facts)
        for sub in self._subs:
            sub.push(facts)
        if decision is not None and facts.tenant is not None:
            if len(self.limits) >= MAX_TENANTS and facts.tenant not in self.limits:
                self.limits.clear()
            self.limits[facts.tenant] = LimitsSeen(facts.created + facts.total_s, decision)

    def newest_first(self) -> Iterator[RequestFacts]:
        return reversed(self._rows)

    def subscribe(self) -> Subscription:
        sub = Subscription()
        if self.closed:
            sub.end()
        else:
            self._subs.append(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        sub.end()
        if sub in self._subs:
            self._subs.remove(sub)

    def close(self) -> None:
        self.closed = True
        subs, self._subs = self._subs, []
        for sub in subs:
            sub.end()

    @property
    def subscribers(self) -> int:
        return len(self._subs)
