"""The KeyStore contract (gateway/tenancy/store.py) as one table of tests, run against every store in
STORES: idempotent reserve and settle, leases that expire unless renewed, the admin reset, "keys are
on" as a recorded fact, and exact concurrency across two clients on the same data (two gateways).

A new store joins with one line in tests/stores/key_stores.STORES."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from gateway.tenancy.keys import KeyPolicy, new_record
from gateway.tenancy.store import KeysActive, Settlement, UsageDelta
from tests.stores.key_stores import SHORT_TTL_MS, Clients, limits, settlement


async def test_a_replayed_reserve_is_admitted_without_a_second_charge(clients: Clients) -> None:
    a, b = clients(), clients()
    lim = limits(rpm=2, tpm=1000, budget_tokens=100, max_concurrency=5)
    first = await a.reserve("k", lim, 10, "r1")
    again = await b.reserve("k", lim, 10, "r1")  # the same id, from the other client: a retry after a timeout
    assert first.admitted and again.admitted
    assert (again.counters.requests, again.counters.tokens, again.counters.inflight, again.counters.budget_used) == (1, 10, 1, 10)
    second = await a.reserve("k", lim, 10, "r2")
    assert second.admitted and second.counters.requests == 2 and second.counters.budget_used == 20
    assert (await a.reserve("k", lim, 10, "r3")).refused == "requests"  # the replay took no request of the two


async def test_a_replayed_settle_changes_nothing(clients: Clients) -> None:
    a, b = clients(), clients()
    lim = limits(max_concurrency=2, budget_tokens=100)
    assert (await a.reserve("s", lim, 10, "r1")).admitted and (await a.reserve("s", lim, 10, "r2")).admitted
    done = settlement("r1", "s", lim, delta=5)
    await a.settle([done])
    await b.settle([done])
    await a.settle([done, done])  # twice in one batch too (a spool replayed after a flush that did write)
    third = await b.reserve("s", lim, 10, "r3")
    assert third.admitted and third.counters.inflight == 2  # r1's slot freed once: r2's is still held
    assert third.counters.budget_used == 10 + 10 + 5 + 10  # r1's 5 tokens added once
    assert (await a.reserve("s", lim, 10, "r4")).refused == "concurrency"
    rows = await a.usage("s")
    assert [(r["requests"], r["prompt_tokens"], r["completion_tokens"]) for r in rows] == [(1, 4, 5)]


async def test_a_refusal_settled_under_the_reserves_id_is_written_once(clients: Clients) -> None:
    a = clients()
    lim = limits(rpm=1)
    assert (await a.reserve("q", lim, 1, "ok")).admitted
    assert (await a.reserve("q", lim, 1, "no")).refused == "requests"
    rejected = Settlement("no", "q", None, 0, False, UsageDelta("q", "m", "2026-12-01", rejected=1))
    await a.settle([rejected])
    await a.settle([rejected])
    await a.settle([settlement("ok", "q", lim, release=False)])  # the reserve's id does not block its settle
    rows = await a.usage("q")
    assert [(r["requests"], r["rejected"]) for r in rows] == [(1, 1)]


async def test_a_lease_not_renewed_expires(clients: Clients) -> None:
    a, b = clients(SHORT_TTL_MS), clients(SHORT_TTL_MS)
    lim = limits(max_concurrency=1)
    assert (await a.reserve("l", lim, 1, "r1")).admitted  # and its client dies: never settled, never renewed
    assert (await b.reserve("l", lim, 1, "r2")).refused == "concurrency"
    await asyncio.sleep(SHORT_TTL_MS / 1000 + 0.15)
    back = await b.reserve("l", lim, 1, "r3")
    assert back.admitted and back.counters.inflight == 1


async def test_a_renewed_lease_is_kept_and_expires_once_renewing_stops(clients: Clients) -> None:
    a, b = clients(SHORT_TTL_MS), clients(SHORT_TTL_MS)
    lim = limits(max_concurrency=1)
    assert (await a.reserve("n", lim, 1, "r1")).admitted
    for _ in range(4):  # 0.8 s in all, twice the expiry
        await asyncio.sleep(SHORT_TTL_MS / 2000)
        await a.renew([("n", "r1"), ("n", "unknown"), ("other", "r1")])
    assert (await b.reserve("n", lim, 1, "r2")).refused == "concurrency"
    await a.renew([])
    await asyncio.sleep(SHORT_TTL_MS / 1000 + 0.15)
    assert (await b.reserve("n", lim, 1, "r3")).admitted


async def test_an_expired_lease_is_not_brought_back_by_renew(clients: Clients) -> None:
    a = clients(SHORT_TTL_MS)
    lim = limits(max_concurrency=1)
    assert (await a.reserve("e", lim, 1, "r1")).admitted
    await asyncio.sleep(SHORT_TTL_MS / 1000 + 0.15)
    assert (await a.reserve("e", lim, 1, "r2")).admitted  # r1's slot went back
    await a.renew([("e", "r1")])  # r1's gateway wakes up: it gets no second slot
    assert (await a.reserve("e", lim, 1, "r3")).refused == "concurrency"


async def test_release_leases_ends_one_tenants_leases(clients: Clients) -> None:
    a, b = clients(), clients()
    lim, one = limits(max_concurrency=2), limits(max_concurrency=1)
    assert all([(await a.reserve("t", lim, 1, f"t{i}")).admitted for i in range(2)])
    assert (await a.reserve("other", one, 1, "o1")).admitted
    assert await b.release_leases("t") == 2
    assert await b.release_leases("t") == 0 and await b.release_leases("nobody") == 0
    assert (await a.reserve("t", lim, 1, "t2")).admitted and (await a.reserve("t", lim, 1, "t3")).admitted
    await a.settle([settlement("t0", "t", lim)])  # a settle of a lease the reset ended frees no other
    assert (await a.reserve("t", lim, 1, "t4")).refused == "concurrency"
    assert (await b.reserve("other", one, 1, "o2")).refused == "concurrency"  # the other tenant's lease is untouched


async def test_a_reserve_ends_the_leases_it_names_released_and_their_settles_free_nothing_more(clients: Clients) -> None:
    """A gateway whose settle of a request is still queued names that request in its key's next reserve: the
    slot is free in that same step, whatever the settle's write does later."""
    a, b = clients(), clients()
    lim = limits(max_concurrency=2)
    assert (await a.reserve("rl", lim, 1, "r1")).admitted and (await b.reserve("rl", lim, 1, "r2")).admitted
    assert (await a.reserve("rl", lim, 1, "r3")).refused == "concurrency"
    freed = await a.reserve("rl", lim, 1, "r4", released=("r1", "unknown"))
    assert freed.admitted and freed.counters.inflight == 2  # r1's slot, and only r1's (r2 is b's, still running)
    await a.settle([settlement("r1", "rl", lim)])  # r1's settle arrives: its lease is already gone, r4's stays
    assert (await b.reserve("rl", lim, 1, "r5")).refused == "concurrency"
    again = await b.reserve("rl", lim, 1, "r6", released=("r1",))  # named twice: nothing more is freed
    assert again.refused == "concurrency" and again.counters.inflight == 2
    assert (await a.reserve("other", limits(max_concurrency=1), 1, "o1", released=("r2",))).admitted
    assert (await a.reserve("rl", lim, 1, "r7")).refused == "concurrency"  # another tenant's reserve frees none of rl's


async def test_keys_are_on_from_the_first_key_until_disable_auth(clients: Clients) -> None:
    a, b = clients(), clients()
    assert not await a.auth_enabled()
    record, _ = new_record("only", KeyPolicy(role="admin"))
    await a.create(record)
    assert await a.auth_enabled() and await b.auth_enabled()
    with pytest.raises(KeysActive):
        await b.disable_auth()
    assert await a.auth_enabled()
    assert await a.revoke("only", 1.0) is not None
    assert await a.auth_enabled() and await b.auth_enabled()  # every key revoked: keys are still required
    await b.disable_auth()
    assert not await a.auth_enabled() and not await b.auth_enabled()
    await b.disable_auth()  # twice: still off, no error
    await a.create(new_record("again", KeyPolicy())[0])
    assert await b.auth_enabled()


async def test_concurrency_is_exact_under_a_burst_from_two_clients(clients: Clients) -> None:
    a, b = clients(), clients()
    lim = limits(max_concurrency=5)
    ids = [f"c{i}" for i in range(40)]
    decisions = await asyncio.gather(*(([a, b][i % 2]).reserve("c", lim, 1, rid) for i, rid in enumerate(ids)))
    admitted = [rid for rid, d in zip(ids, decisions, strict=True) if d.admitted]
    assert len(admitted) == 5
    assert sorted(d.counters.inflight for d in decisions if d.admitted) == [1, 2, 3, 4, 5]
    await asyncio.gather(*(([a, b][i % 2]).settle([settlement(rid, "c", lim)]) for i, rid in enumerate(admitted)))
    again = await asyncio.gather(*(([a, b][i % 2]).reserve("c", lim, 1, f"d{i}") for i in range(20)))
    assert sum(d.admitted for d in again) == 5


class Events:
    """What a store's watch reports: True (live, or a key changed), False (the channel lost)."""

    def __init__(self) -> None:
        self.seen: list[bool] = []
        self.changed = asyncio.Event()

    def __call__(self, live: bool) -> None:
        self.seen.append(live)
        self.changed.set()

    async def next(self) -> bool:
        await asyncio.wait_for(self.changed.wait(), 10)  # a hang guard, not a latency bound
        self.changed.clear()
        return self.seen[-1]


async def test_a_revoke_or_rotation_by_another_client_is_pushed_to_the_watch(clients: Clients) -> None:
    gateway, other = clients(), clients()
    first, _ = new_record("watched", KeyPolicy())
    await other.create(first)
    events = Events()
    watch = asyncio.create_task(gateway.watch(events))
    try:
        assert await events.next() is True  # live: from here a lookup may be cached
        seen = len(events.seen)
        assert (await gateway.lookup(first.secret_hash)) is not None
        await asyncio.sleep(0.3)
        assert len(events.seen) == seen  # lookups and usage are no key change
        await other.settle([settlement("w1", "watched", None, release=False)])
        await asyncio.sleep(0.3)
        assert len(events.seen) == seen
        await other.replace_secret("watched", "0" * 64)
        assert await events.next() is True
        await other.revoke("watched", 1.0)
        assert await events.next() is True
        second, _ = new_record("mine", KeyPolicy())
        await gateway.create(second)
        await asyncio.sleep(0.3)
        events.changed.clear()
        await gateway.revoke("mine", 3.0)  # this client's own change reaches its own watch too
        assert await events.next() is True
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch


async def test_a_reserve_under_a_revoked_or_rotated_secret_is_refused_and_charges_nothing(clients: Clients) -> None:
    a, b = clients(), clients()
    record, _ = new_record("checked", KeyPolicy())
    await a.create(record)
    lim = limits(rpm=2, tpm=1000, budget_tokens=100, max_concurrency=1)
    assert (await b.reserve("checked", lim, 10, "c1", record.secret_hash)).admitted
    await a.replace_secret("checked", "0" * 64)  # rotated by the other process
    assert (await b.reserve("checked", lim, 10, "c2", record.secret_hash)).refused == "revoked"
    assert (await b.reserve("checked", lim, 10, "c3", "1" * 64)).refused == "revoked"  # never its secret
    await b.settle([settlement("c1", "checked", lim, -10)])
    after = await b.reserve("checked", lim, 10, "c4", "0" * 64)  # the new secret: nothing of c2, c3 was charged
    assert after.admitted and (after.counters.requests, after.counters.inflight, after.counters.budget_used) == (2, 1, 10)
    await a.revoke("checked", 1.0)
    assert (await b.reserve("checked", lim, 10, "c5", "0" * 64)).refused == "revoked"
    assert (await b.reserve("unknown", lim, 10, "c6", "0" * 64)).refused == "revoked"
    assert (await b.reserve("unknown", lim, 10, "c7")).admitted  # no secret given: limits only (config-file keys)


async def test_one_settle_call_of_many_tenants_applies_each_once_and_its_replay_nothing(clients: Clients) -> None:
    a = clients()
    lim = limits(max_concurrency=10, tpm=1000)
    for i in range(6):
        assert (await a.reserve(f"t{i % 2}", lim, 10, f"m{i}")).admitted
    batch = [settlement(f"m{i}", f"t{i % 2}", lim, -5) for i in range(6)]  # the writer's batch: tenants interleaved
    await a.settle(batch)
    await a.settle(batch)  # the same batch replayed whole (a write that timed out)
    for name in ("t0", "t1"):
        assert [r["requests"] for r in await a.usage(name)] == [3]
        after = await a.reserve(name, lim, 10, f"after-{name}")
        assert after.counters.inflight == 1 and after.counters.tokens == 3 * 5 + 10  # every slot freed, refunds once


async def test_a_grant_is_cut_where_reserves_would_be_refused_and_takes_no_lease(clients: Clients) -> None:
    a = clients()
    lim = limits(rpm=6, tpm=1000, budget_tokens=10_000, max_concurrency=1)
    assert (await a.reserve("g", lim, 10, "r1")).admitted  # holds the one slot
    grant = await a.grant("g", lim, 10, 20)
    assert grant.granted == 5 and grant.decision.admitted  # 6 requests a window: 1 reserved, 5 granted of 10
    c = grant.decision.counters
    assert (c.requests, c.tokens, c.budget_used) == (6, 10 + 5 * 20, 10 + 5 * 20)
    assert (await a.reserve("g", lim, 10, "r2")).refused == "requests"
    none = await a.grant("g", lim, 3, 20)
    assert none.granted == 0 and none.decision.refused == "requests"
    tokens = await a.grant("t", limits(tpm=100), 10, 30)  # 30, 60, 90; the 4th would pass 100
    assert tokens.granted == 3 and tokens.decision.counters.tokens == 90
    budget = await a.grant("b", limits(budget_tokens=50), 10, 20)
    assert budget.granted == 2 and budget.decision.counters.budget_used == 40
    again = await a.reserve("g2", limits(max_concurrency=1), 1, "r3")
    assert again.admitted and again.counters.inflight == 1  # a grant's requests hold no lease


async def test_grants_from_two_clients_never_pass_a_limit_together(clients: Clients) -> None:
    a, b = clients(), clients()
    lim = limits(rpm=50, budget_tokens=10_000)
    grants = await asyncio.gather(*(([a, b][i % 2]).grant("two", lim, 8, 10) for i in range(10)))
    assert sum(g.granted for g in grants) == 50
    assert (await a.reserve("two", lim, 10, "last")).refused == "requests"


async def test_a_grant_under_a_revoked_secret_grants_nothing(clients: Clients) -> None:
    a = clients()
    record, _ = new_record("gone", KeyPolicy())
    await a.create(record)
    lim = limits(rpm=10)
    assert (await a.grant("gone", lim, 3, 0, record.secret_hash)).granted == 3
    await a.revoke("gone", 1.0)
    refused = await a.grant("gone", lim, 3, 0, record.secret_hash)
    assert refused.granted == 0 and refused.decision.refused == "revoked"
    assert (await a.reserve("gone", lim, 0, "r1")).counters.requests == 4  # nothing of g2 was charged
