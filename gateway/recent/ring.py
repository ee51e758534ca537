"""The recent requests: a bounded ring of finished records, and the live subscriptions to new ones.

Concurrency rule: everything runs on the event loop and nothing here awaits while it holds state.
`record` (the hot path, once per request) is one deque append plus, per live subscriber, its
`accepts` check and one list append where it accepts the record; a subscriber that falls
`SUBSCRIBER_BACKLOG` of its records behind is ended (marked `lagged`), never waited for. A subscriber
is woken only by records it accepts, so neither its wake-ups nor its backlog tell it of the others.
`close` (the drain's start, the lifespan's end) ends every subscription and refuses new ones, so a
live stream never holds the gateway's shutdown.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from gateway.recent.facts import RequestFacts
from gateway.tenancy.limits import Decision

SUBSCRIBER_BACKLOG = 1000
MAX_TENANTS = 10_000


class Subscription:
    """One live reader's queue of records not yet sent."""

    __slots__ = ("_wake", "accepts", "ended", "items", "lagged", "owner")

    def __init__(self, accepts: Callable[[RequestFacts], bool] = lambda _: True, owner: str | None = None) -> None:
        self.accepts = accepts
        """The records this reader may see and asked for: only those are queued (and wake it)."""
        self.owner = owner
        """Whose reader it is (a tenant's name; None: no keys), for the cap on live readers per owner."""
        self.items: list[RequestFacts] = []
        self.ended = False
        self.lagged = False
        self._wake = asyncio.Event()

    def push(self, facts: RequestFacts) -> None:
        if not self.accepts(facts):
            return
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

    def subscribe(self, accepts: Callable[[RequestFacts], bool] = lambda _: True,
                  owner: str | None = None) -> Subscription:
        sub = Subscription(accepts, owner)
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

    def subscribers_of(self, owner: str | None) -> int:
        return sum(1 for sub in self._subs if sub.owner == owner)
