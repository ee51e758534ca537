"""The ring keeps the newest `size` records; a live subscription gets each new one, ends when it falls
too far behind or the ring closes, and a closed ring's new subscriptions end at once."""

from __future__ import annotations

import asyncio

from gateway.recent import RecentRequests, RequestFacts
from gateway.recent import ring as ring_module
from gateway.tenancy.limits import Counters, Decision, Limits


def facts(i: int, tenant: str | None = None) -> RequestFacts:
    f = RequestFacts(f"id{i}", 1000.0 + i, "/v1/chat/completions", 0.0)
    f.tenant = tenant
    return f


def test_the_ring_keeps_the_newest_size_records_newest_first() -> None:
    ring = RecentRequests(3)
    for i in range(5):
        ring.record(facts(i))
    assert [f.id for f in ring.newest_first()] == ["id4", "id3", "id2"]
    off = RecentRequests(0)
    off.record(facts(1))
    assert list(off.newest_first()) == []


async def test_a_subscription_gets_new_records_and_ends_on_close() -> None:
    ring = RecentRequests(10)
    sub = ring.subscribe()
    ring.record(facts(1))
    ring.record(facts(2))
    assert [f.id for f in await sub.next()] == ["id1", "id2"]
    waiting = asyncio.ensure_future(sub.next())
    await asyncio.sleep(0)
    ring.record(facts(3))
    assert [f.id for f in await waiting] == ["id3"]
    assert await sub.next(timeout=0.01) == []  # nothing new: the heartbeat's turn
    waiting = asyncio.ensure_future(sub.next())
    await asyncio.sleep(0)
    ring.close()
    assert await waiting is None and ring.subscribers == 0
    late = ring.subscribe()
    assert await late.next() is None


async def test_a_reader_that_falls_behind_is_ended_not_waited_for(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(ring_module, "SUBSCRIBER_BACKLOG", 2)
    ring = RecentRequests(10)
    sub = ring.subscribe()
    for i in range(3):
        ring.record(facts(i))
    assert sub.lagged and await sub.next() is None
    ring.unsubscribe(sub)
    assert ring.subscribers == 0
    assert len(list(ring.newest_first())) == 3  # the ring itself kept them all


def test_the_last_decision_of_each_tenant_is_kept() -> None:
    ring = RecentRequests(10)
    limits = Limits(10, None, None, None, 60_000, "2026-12", 1000)
    decision = Decision(limits, Counters(requests=3, requests_reset_ms=50_000))
    ring.record(facts(1, "a"), decision)
    ring.record(facts(2, None), decision)  # no tenant (no keys): nothing to keep
    assert set(ring.limits) == {"a"} and ring.limits["a"].decision.counters.requests == 3


async def test_a_readers_backlog_counts_only_the_records_it_accepts(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(ring_module, "SUBSCRIBER_BACKLOG", 2)
    ring = RecentRequests(10)
    sub = ring.subscribe(lambda f: f.tenant == "a", owner="a")
    for i in range(5):
        ring.record(facts(i, "b"))  # others' volume: no lag (its `lagged` end would tell of it)
    ring.record(facts(9, "a"))
    assert not sub.lagged and [f.id for f in await sub.next()] == ["id9"]
    assert ring.subscribers_of("a") == 1 and ring.subscribers_of("b") == 0
