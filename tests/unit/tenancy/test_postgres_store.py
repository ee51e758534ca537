"""The KeyStore contract against a real PostgreSQL (tests/postgres_server.py): the PostgreSQL store
(gateway/tenancy/postgres_store.py) with each client its own pool on one database, as two gateways
have. The contract itself runs on it in the shared table (tests/unit/tenancy/test_store_contract.py);
these are what this store adds: its SQL decision against limits.check, exact limits under a burst of
60 reserves from two clients, no deadlock for one busy tenant, the schema migrated once by clients
starting together, the ledger's upserts, the database stopped and started again, and the Redis split."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any
from pathlib import Path

import pytest
import pytest_asyncio

from gateway.database import Database
from gateway.tenancy.keys import KeyPolicy, hash_secret, new_record
from gateway.tenancy.limits import Counters, Limits, check
from gateway.tenancy.postgres_store import STEPS, PostgresKeyStore
from gateway.tenancy.store import KeyExists, KeysActive, KeyStore, Settlement, StoreUnavailable, UsageDelta
from tests.postgres_server import PostgresServer, postgres, postgres_server, postgres_url  # noqa: F401  (fixtures)
from tests.stores.key_stores import NOW, Clients, limits, postgres_store, settlement

TIMEOUT_S = 2.0


@pytest_asyncio.fixture
async def clients(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Clients]:
    made = Clients(postgres_store(request, tmp_path))
    yield made
    await made.close()


# -- keys ------------------------------------------------------------------------------------
async def test_key_lifecycle_across_two_clients(clients: Clients) -> None:
    a, b = clients(), clients()
    record, secret = new_record("team-a", KeyPolicy(rpm=5, models=("m",)), now=1.0)
    await a.create(record)
    found = await b.lookup(hash_secret(secret))
    assert found is not None and found.name == "team-a" and found.policy.rpm == 5 and found.policy.models == ("m",)
    with pytest.raises(KeyExists):
        await b.create(new_record("team-a", KeyPolicy())[0])
    new_hash = hash_secret("rotated")
    assert (await b.replace_secret("team-a", new_hash)) is not None
    assert await a.lookup(hash_secret(secret)) is None and await a.lookup(new_hash) is not None
    revoked = await a.revoke("team-a", 5.0)
    assert revoked is not None and revoked.revoked_at == 5.0
    assert await b.lookup(new_hash) is None  # a revoked key keeps no hash: gone for every gateway at once
    assert await b.revoke("team-a", 6.0) is None and await b.replace_secret("team-a", "x") is None
    assert [(r.name, r.revoked_at) for r in await b.list()] == [("team-a", 5.0)]
    again, again_secret = new_record("team-a", KeyPolicy())
    await b.create(again)  # a revoked name may be taken again
    assert (await a.lookup(hash_secret(again_secret))) is not None
    assert await a.get("nobody") is None and await a.lookup("no-such-hash") is None


async def test_disable_auth_racing_a_create_never_leaves_an_active_key_with_auth_off(clients: Clients) -> None:
    a, b = clients(), clients()
    await a.create(new_record("first", KeyPolicy())[0])
    await a.revoke("first", 1.0)
    for i in range(10):
        results = await asyncio.gather(a.create(new_record(f"k{i}", KeyPolicy())[0]), b.disable_auth(),
                                       return_exceptions=True)
        assert results[0] is None and (results[1] is None or isinstance(results[1], KeysActive))
        assert await a.auth_enabled()  # a key is active: whichever ran first, keys are on
        await a.revoke(f"k{i}", 2.0)


# -- accounting ------------------------------------------------------------------------------
async def test_a_refund_never_takes_a_counter_below_zero(clients: Clients) -> None:
    a = clients()
    lim = limits(tpm=100, budget_tokens=100)
    assert (await a.reserve("z", lim, 10, "r1")).admitted
    await a.settle([settlement("r1", "z", lim, delta=-50)])
    d = await a.reserve("z", lim, 100, "r2")  # both back at 0: a 100-token request fits exactly
    assert d.admitted and d.counters.tokens == 100 and d.counters.budget_used == 100
    assert (await a.reserve("z", lim, 1, "r3")).refused == "tokens"


async def test_the_ledger_adds_up_per_key_model_and_day(clients: Clients) -> None:
    a, b = clients(), clients()
    for i, (store, model, day) in enumerate([(a, "m1", "2026-12-01"), (b, "m1", "2026-12-01"), (a, "m2", "2026-12-01"),
                                             (b, "m1", "2026-12-02")]):
        await store.settle([Settlement(f"u{i}", "led", None, 0, False,
                                       UsageDelta("led", model, day, requests=1, prompt_tokens=3, engine_ms=7))])
    await a.settle([Settlement("x", "other", None, 0, False, UsageDelta("other", "m1", "2026-12-02", errors=1))])
    rows = await b.usage("led")
    assert [(r["day"], r["model"], r["requests"], r["prompt_tokens"], r["engine_ms"]) for r in rows] == [
        ("2026-12-01", "m1", 2, 6, 14), ("2026-12-01", "m2", 1, 3, 7), ("2026-12-02", "m1", 1, 3, 7)]
    assert [(r["name"], r["day"]) for r in await a.usage(since="2026-12-02")] == [("led", "2026-12-02"), ("other", "2026-12-02")]
    assert all(isinstance(r["requests"], int) for r in rows)


RULE_CASES = {
    "rpm": {"rpm": 6}, "tpm": {"tpm": 50}, "concurrency": {"max_concurrency": 3}, "budget": {"budget_tokens": 90},
    "all": {"rpm": 9, "tpm": 80, "max_concurrency": 4, "budget_tokens": 120},
}


@pytest.mark.parametrize("case", list(RULE_CASES))
async def test_the_sql_decision_is_limits_check(clients: Clients, case: str) -> None:
    """Every decision the database makes is the one limits.check makes on the counters it found (as
    found when refused; after the charge when admitted), through refusals, refunds and releases."""
    a = clients()
    lim = limits(**RULE_CASES[case])
    rng = random.Random(case)
    seen: set[str | None] = set()
    held: list[str] = []
    for i in range(40):
        cost = rng.choice([0, 1, 5, 20, 45, 60])
        d = await a.reserve(case, lim, cost, f"{case}{i}")
        seen.add(d.refused)
        if d.refused:
            assert check(lim, d.counters, cost) == d.refused
        else:
            c = d.counters
            before = Counters(c.requests - 1, c.requests_reset_ms, c.tokens - cost, c.tokens_reset_ms,
                              c.inflight - 1, c.budget_used - cost)
            assert check(lim, before, cost) is None
            held.append(f"{case}{i}")
        if held and rng.random() < 0.4:  # a request ends: its lease back, part of its charge refunded
            await a.settle([settlement(held.pop(0), case, lim, delta=-rng.choice([0, 3, 10]))])
    assert None in seen and len(seen) >= 2  # both answers happened


async def test_a_window_starts_again_once_it_ended(clients: Clients) -> None:
    a = clients()
    lim = Limits.of(KeyPolicy(rpm=2, window_seconds=0.3), NOW)
    assert (await a.reserve("w", lim, 1, "w1")).admitted and (await a.reserve("w", lim, 1, "w2")).admitted
    refused = await a.reserve("w", lim, 1, "w3")
    assert refused.refused == "requests" and 0 < refused.counters.requests_reset_ms <= 300
    await asyncio.sleep(0.4)
    back = await a.reserve("w", lim, 1, "w4")
    assert back.admitted and back.counters.requests == 1


async def test_limits_are_exact_under_60_concurrent_reserves_from_two_clients(clients: Clients) -> None:
    a, b = clients(), clients()
    rpm = limits(rpm=17)
    decisions = await asyncio.gather(*(([a, b][i % 2]).reserve("burst", rpm, 1, f"b{i}") for i in range(60)))
    assert sum(d.admitted for d in decisions) == 17
    assert sorted(d.counters.requests for d in decisions if d.admitted) == list(range(1, 18))
    assert {d.refused for d in decisions if not d.admitted} == {"requests"}

    conc = limits(max_concurrency=5, budget_tokens=40)
    ids = [f"c{i}" for i in range(60)]
    decisions = await asyncio.gather(*(([a, b][i % 2]).reserve("conc", conc, 4, rid) for i, rid in enumerate(ids)))
    admitted = [rid for rid, d in zip(ids, decisions, strict=True) if d.admitted]
    assert len(admitted) == 5
    assert sorted(d.counters.inflight for d in decisions if d.admitted) == [1, 2, 3, 4, 5]
    await asyncio.gather(*(([a, b][i % 2]).settle([settlement(rid, "conc", conc)]) for i, rid in enumerate(admitted)))
    again = await asyncio.gather(*(([a, b][i % 2]).reserve("conc", conc, 4, f"d{i}") for i in range(60)))
    assert sum(d.admitted for d in again) == 5  # the budget (40 = 10 x 4) has room for exactly 5 more
    assert sorted(d.counters.budget_used for d in again if d.admitted) == [24, 28, 32, 36, 40]
    assert {d.refused for d in again if not d.admitted} <= {"concurrency", "budget"}


async def test_one_tenants_reserves_settles_and_renewals_at_once_never_deadlock(clients: Clients) -> None:
    """What a busy key does on two gateways: every request a reserve, then its settle, while the
    gateways renew leases; before settles took the tenant's lock, this failed with deadlocks and
    statement timeouts."""
    a, b = clients(), clients()
    lim = limits(rpm=10**9, tpm=10**12, max_concurrency=10**6, budget_tokens=10**12)

    async def request(store: KeyStore, rid: str) -> None:
        assert (await store.reserve("busy", lim, 10, rid)).admitted
        await store.renew([("busy", rid), ("other", "x")])
        await store.settle([settlement(rid, "busy", lim, delta=5)])

    async def worker(w: int) -> None:
        for i in range(20):
            await request([a, b][w % 2], f"w{w}-{i}")

    await asyncio.gather(*(worker(w) for w in range(32)))
    assert [(r["requests"], r["completion_tokens"]) for r in await a.usage("busy")] == [(640, 3200)]
    last = await b.reserve("busy", lim, 0, "last")
    assert last.counters.budget_used == 640 * 15 and last.counters.inflight == 1 and last.counters.requests == 641


async def test_clients_starting_together_on_an_empty_database_migrate_it_once(clients: Clients) -> None:
    stores = [clients() for _ in range(4)]
    assert await asyncio.gather(*(s.auth_enabled() for s in stores)) == [False] * 4
    db: Database = stores[0].db  # type: ignore[attr-defined]
    async with db.connection() as conn:
        assert await conn.fetchval("SELECT version FROM schema_versions WHERE component = 'tenancy'") == len(STEPS)


async def test_reserves_queued_behind_one_in_flight_go_in_one_call_each_decided_in_order(clients: Clients) -> None:
    a, b = clients(), clients()
    calls: list[int] = []
    decide = a._decide  # type: ignore[attr-defined]

    async def counted(group: Any, batch: list[Any]) -> None:
        calls.append(len(batch))
        await decide(group, batch)

    a._decide = counted  # type: ignore[attr-defined]
    lim = limits(rpm=25, max_concurrency=20)
    decisions = await asyncio.gather(*(([a, b][i % 3 == 2]).reserve("q", lim, 1, f"q{i}") for i in range(45)))
    assert sum(calls) == 30 and len(calls) < 30 and calls[0] == 1  # one alone, the rest queued behind it
    admitted = [d for d in decisions if d.admitted]
    assert len(admitted) == 20  # the concurrency cap, exact across both clients' batches
    assert sorted(d.counters.inflight for d in admitted) == list(range(1, 21))
    assert {d.refused for d in decisions if not d.admitted} == {"concurrency"}


async def test_a_queued_reserve_cancelled_before_its_call_charges_nothing(clients: Clients) -> None:
    a = clients()
    lim = limits(rpm=10)
    first = asyncio.create_task(a.reserve("c", lim, 1, "c1"))
    await asyncio.sleep(0)  # c1's call is in flight: the next two queue behind it
    gone = asyncio.create_task(a.reserve("c", lim, 1, "c2"))
    kept = asyncio.create_task(a.reserve("c", lim, 1, "c3"))
    await asyncio.sleep(0)
    gone.cancel()
    assert (await first).admitted and (await kept).admitted
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert (await a.reserve("c", lim, 1, "c4")).counters.requests == 3  # c1, c3, c4: never c2


async def test_every_queued_reserve_hears_the_store_fault(clients: Clients) -> None:
    a = clients()
    await a.reserve("f", limits(rpm=10), 1, "warm")
    await a.db.close()  # type: ignore[attr-defined]
    results = await asyncio.gather(*(a.reserve("f", limits(rpm=10), 1, f"f{i}") for i in range(8)), return_exceptions=True)
    assert all(isinstance(r, StoreUnavailable) for r in results)


async def test_two_gateways_never_run_more_than_the_cap_with_releases_in_the_reserve(clients: Clients) -> None:
    """Two gateways' services on one database, every request reserving while other requests' settles are
    still queued (their ids named in the reserve): the requests really running never exceed the cap."""
    from gateway.tenancy.limits import Reservation
    from gateway.tenancy.service import Refused, Tenancy

    record = new_record("cap", KeyPolicy(max_concurrency=3, rpm=10**6))[0]
    gateways = [Tenancy(clients()), Tenancy(clients())]
    await gateways[0].store.create(record)
    running, most, admitted = 0, 0, 0

    async def worker(w: int) -> None:
        nonlocal running, most, admitted
        here = gateways[w % 2]
        for _ in range(15):
            try:
                ticket = await here.reserve(record, "m", Reservation(1, 0))
            except Refused:
                await asyncio.sleep(0)
                continue
            running += 1
            most, admitted = max(most, running), admitted + 1
            await asyncio.sleep(0.001 * (w % 3))
            running -= 1  # the request ended: only now may its slot be taken again
            await here.settle(ticket, failed=False, engine_s=0.0)

    await asyncio.gather(*(worker(w) for w in range(16)))
    assert most <= 3 and admitted >= 15
    for g in gateways:
        await g.flush()
    assert (await gateways[0].store.release_leases("cap")) == 0  # every lease ended: none leaked


# -- faults ----------------------------------------------------------------------------------
async def test_the_database_stopped_is_store_unavailable_in_time_and_started_again_it_answers() -> None:
    with postgres_server() as server:
        url = server.createdb().replace("eg@", "eg:s3cret-pw@")  # trust auth: any password; never in a message
        store = PostgresKeyStore(Database(url, 1.0), owns_database=True)
        try:
            record, secret = new_record("f", KeyPolicy(rpm=100))
            await store.create(record)
            server.stop()
            lim = limits(rpm=100)
            for call in (lambda: store.lookup(hash_secret(secret)), lambda: store.reserve("f", lim, 1, "x"),
                         lambda: store.settle([settlement("x", "f", lim)]), store.auth_enabled):
                with pytest.raises(StoreUnavailable) as caught:
                    await call()
                assert "s3cret-pw" not in str(caught.value) and "127.0.0.1" in str(caught.value)
            server.start()
            found = await store.lookup(hash_secret(secret))  # the same store, no restart: it answers again
            assert found is not None and found.name == "f"
            assert (await store.reserve("f", lim, 1, "y")).admitted
        finally:
            await store.close()


async def test_a_store_made_while_the_database_is_down_migrates_when_it_comes_up() -> None:
    with postgres_server() as server:
        url = server.createdb()
        server.stop()
        store = PostgresKeyStore(Database(url, 1.0), owns_database=True)
        try:
            with pytest.raises(StoreUnavailable):
                await store.auth_enabled()
            server.start()
            assert not await store.auth_enabled()
            await store.create(new_record("late", KeyPolicy())[0])
            assert await store.auth_enabled()
        finally:
            await store.close()


# -- with tenancy.redis_url too: keys and the ledger in PostgreSQL, the counters in Redis --------
async def test_with_redis_the_keys_and_ledger_are_in_postgres_and_the_counters_in_redis(postgres_url: str) -> None:  # noqa: F811
    from gateway.config import TenancyConfig
    from gateway.tenancy.redis_store import RedisKeyStore
    from gateway.tenancy.setup import open_store
    from gateway.tenancy.split_store import SplitKeyStore
    from tests.redis_server import redis_server

    with redis_server() as redis:
        cfg = TenancyConfig(redis_url=redis.url, redis_prefix="split:")
        split = open_store(cfg, Database(postgres_url, TIMEOUT_S), owns_database=True)
        plain_pg = PostgresKeyStore(Database(postgres_url, TIMEOUT_S), owns_database=True)
        plain_redis = RedisKeyStore(redis.url, "split:")
        try:
            assert isinstance(split, SplitKeyStore)
            record, secret = new_record("both", KeyPolicy(rpm=2))
            await split.create(record)
            assert (await plain_pg.lookup(hash_secret(secret))) is not None and await plain_pg.auth_enabled()
            assert await plain_redis.list() == []  # no key in Redis
            lim = limits(rpm=2)
            assert (await split.reserve("both", lim, 1, "r1")).admitted
            assert (await plain_redis.reserve("both", lim, 1, "r2")).counters.requests == 2  # the counter is Redis's
            assert (await split.reserve("both", lim, 1, "r3")).refused == "requests"
            assert (await plain_pg.reserve("both", lim, 1, "r4")).counters.requests == 1  # PostgreSQL holds none
            await split.settle([settlement("r1", "both", lim)])
            await split.settle([settlement("r1", "both", lim)])  # replayed: once in the ledger
            assert [(r["name"], r["requests"]) for r in await split.usage("both")] == [("both", 1)]
            assert [r["requests"] for r in await plain_pg.usage("both")] == [1]
        finally:
            for store in (split, plain_pg, plain_redis):
                await store.close()
