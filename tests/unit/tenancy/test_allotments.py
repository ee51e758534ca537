"""Local allotments (gateway/tenancy/allotment.py, service.py) on real stores: a busy key is admitted from
capacity granted ahead of need, with far fewer store calls than requests, and still exactly to its limits, alone
and with two gateways on one store; its kept leases hold its concurrency cap and go back when idle; a revoke
ends local admission; its unused budget comes back; with `allotments: false` every request asks the store."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.tenancy import service
from gateway.tenancy.keys import KeyPolicy, KeyRecord, new_record
from gateway.tenancy.limits import Limits, Reservation
from gateway.tenancy.service import KeyRevoked, Refused, Tenancy
from gateway.tenancy.sqlite_store import SQLiteKeyStore
from gateway.tenancy.store import Grant, KeyStore
from tests.stores.key_stores import Clients

CHARGE = Reservation(prompt=20, output=30)


class Counting:
    """A real store that counts its reserve and grant calls."""

    def __init__(self, inner: KeyStore) -> None:
        self.inner = inner
        self.reserves = 0
        self.grants: list[int] = []

    async def reserve(self, *args: Any, **kwargs: Any) -> Any:
        self.reserves += 1
        return await self.inner.reserve(*args, **kwargs)

    async def grant(self, *args: Any, **kwargs: Any) -> Grant:
        granted = await self.inner.grant(*args, **kwargs)
        self.grants.append(granted.granted)
        return granted

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def wait_for(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10  # a hang guard, not a latency bound
    while not done():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def started(store: KeyStore, allotments: bool = True) -> Tenancy:
    tenancy = Tenancy(store, allotments=allotments)
    await tenancy.start()
    await wait_for(lambda: tenancy._cache_live, "the watch never went live")
    return tenancy


async def one(tenancy: Tenancy, record: KeyRecord, used: int = 25) -> bool:
    """One request: admitted (and settled, having used `used` tokens) or refused."""
    try:
        ticket = await tenancy.reserve(record, "m", CHARGE)
    except Refused:
        return False
    ticket.record(prompt_tokens=20, completion_tokens=used - 20)
    await tenancy.settle(ticket, failed=False, engine_s=0.0)
    return True


async def made_key(store: KeyStore, **policy: Any) -> KeyRecord:
    record, _ = new_record("busy", KeyPolicy(**policy))
    await store.create(record)
    return record


async def test_a_busy_key_is_admitted_from_its_allotment_exactly_to_its_limit(clients: Clients) -> None:
    store = Counting(clients())
    record = await made_key(store, rpm=1500, budget_tokens=1_000_000, max_concurrency=4)
    tenancy = await started(store)
    admitted = [await one(tenancy, record) for _ in range(1600)]
    assert sum(admitted) == 1500 and not any(admitted[1500:])  # exact, in order: the first 1500
    assert store.grants and max(store.grants) > 2
    print(f"store calls: {store.reserves} reserves, {len(store.grants)} grants for 1500 requests")
    assert store.reserves + len(store.grants) < 1500 / 4  # most requests asked the store nothing
    await tenancy.close()


async def test_two_gateways_on_one_store_admit_exactly_the_limit_together(clients: Clients) -> None:
    stores = [Counting(clients()), Counting(clients())]
    record = await made_key(stores[0], rpm=150, budget_tokens=1_000_000)
    gateways = [await started(s) for s in stores]

    async def client(g: Tenancy) -> int:
        return sum([await one(g, record) for _ in range(120)])

    served = await asyncio.gather(*(client(gateways[i % 2]) for i in range(4)))
    assert sum(served) == 150
    assert sum(len(s.grants) for s in stores) > 0
    for g in gateways:
        await g.close()


async def test_the_budget_charged_is_what_the_requests_used_once_allotments_end(clients: Clients) -> None:
    store = clients()
    record = await made_key(store, budget_tokens=1_000_000, rpm=10_000)
    tenancy = await started(store)
    for i in range(120):
        assert await one(tenancy, record, used=21 + i % 7)
    await tenancy.close()  # gives back the unused budget of its allotment
    reader = clients()
    lim = Limits.of(record.policy, time.time())
    check = await reader.reserve("busy", lim, 0, "read")
    assert check.counters.budget_used == sum(21 + i % 7 for i in range(120))


async def test_kept_leases_hold_the_concurrency_cap_and_go_back_when_idle(tmp_path: Path) -> None:
    store = Counting(SQLiteKeyStore(tmp_path / "k.sqlite3"))
    record = await made_key(store, max_concurrency=2, rpm=10_000)
    tenancy = await started(store)
    for _ in range(40):
        assert await one(tenancy, record)
    reserves = store.reserves
    held = [await tenancy.reserve(record, "m", CHARGE) for _ in range(2)]
    with pytest.raises(Refused) as refused:
        await tenancy.reserve(record, "m", CHARGE)
    assert refused.value.decision.refused == "concurrency"
    assert store.reserves - reserves == 2  # one slot was kept from the requests before: the other and the refusal asked
    for ticket in held:
        await tenancy.settle(ticket, failed=False, engine_s=0.0)
    other = SQLiteKeyStore(tmp_path / "k.sqlite3")  # another gateway on the file
    lim = Limits.of(record.policy, time.time())
    await wait_for(lambda: not tenancy._idle, "kept leases were never given back")
    await tenancy.flush()
    assert (await other.reserve("busy", lim, 0, "o1")).counters.inflight == 1  # its own: both kept ones ended
    await other.close()
    await tenancy.close()


async def test_a_revoke_ends_admission_from_the_allotment(tmp_path: Path) -> None:
    store = Counting(SQLiteKeyStore(tmp_path / "k.sqlite3"))
    record = await made_key(store, rpm=10_000)
    tenancy = await started(store)
    for _ in range(40):
        assert await one(tenancy, record)
    assert tenancy._allotted  # it had one
    other = SQLiteKeyStore(tmp_path / "k.sqlite3")
    await other.revoke("busy", time.time())
    await wait_for(lambda: not tenancy._allotted, "the revoke never reached the allotments")
    with pytest.raises(KeyRevoked):
        await tenancy.reserve(record, "m", CHARGE)  # a stale record (a lookup cached elsewhere): the store says no
    await other.close()
    await tenancy.close()


async def test_no_allotment_without_a_live_push_channel_or_when_turned_off(tmp_path: Path) -> None:
    store = Counting(SQLiteKeyStore(tmp_path / "k.sqlite3"))
    record = await made_key(store, rpm=10_000, max_concurrency=3)
    unstarted = Tenancy(store)
    for _ in range(30):
        assert await one(unstarted, record)
    assert store.reserves == 30 and not store.grants
    off = await started(store, allotments=False)
    for _ in range(30):
        assert await one(off, record)
    assert store.reserves == 60 and not store.grants
    await unstarted.close()
    await off.close()


async def test_a_quiet_key_asks_the_store_every_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "LEASE_HOLD_S", 0.01)
    store = Counting(SQLiteKeyStore(tmp_path / "k.sqlite3"))
    record = await made_key(store, rpm=10_000)
    tenancy = await started(store)
    for _ in range(4):
        assert await one(tenancy, record)
        await asyncio.sleep(0.25)  # 4 a second: below MIN_GRANT per DEMAND_WINDOW_S
    assert store.reserves == 4 and not store.grants
    await tenancy.close()


async def test_a_lease_is_not_kept_past_its_reuse_bound_nor_after_an_admin_reset(tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    store = Counting(SQLiteKeyStore(tmp_path / "k.sqlite3"))
    record = await made_key(store, max_concurrency=1, rpm=10_000)
    tenancy = await started(store)
    first = await tenancy.reserve(record, "m", CHARGE)
    await tenancy.settle(first, failed=False, engine_s=0.0)
    assert first.lease_id in tenancy._idle["busy"]  # kept for the next request
    second = await tenancy.reserve(record, "m", CHARGE)
    assert second.lease_id == first.lease_id
    monkeypatch.setattr(service, "LEASE_REUSE_S", 0.0)  # its reuse bound passed: this settle releases it
    await tenancy.settle(second, failed=False, engine_s=0.0)
    assert not tenancy._idle and not tenancy._leases
    monkeypatch.setattr(service, "LEASE_REUSE_S", 10.0)
    third = await tenancy.reserve(record, "m", CHARGE)
    assert third.lease_id != first.lease_id
    assert await store.release_leases("busy") == 1  # the admin reset: /admin/keys/busy/release-leases
    tenancy.leases_released("busy")
    await tenancy.settle(third, failed=False, engine_s=0.0)
    assert not tenancy._idle  # the store no longer counts it: never taken again
    fourth = await tenancy.reserve(record, "m", CHARGE)
    assert fourth.lease_id not in {first.lease_id, third.lease_id}
    await tenancy.settle(fourth, failed=False, engine_s=0.0)
    await tenancy.close()


async def test_a_settle_after_close_goes_to_the_spool(tmp_path: Path) -> None:
    store = SQLiteKeyStore(tmp_path / "k.sqlite3")
    record = await made_key(store, rpm=10_000)
    tenancy = Tenancy(store, spool=tmp_path / "spool.jsonl")
    await tenancy.start()
    ticket = await tenancy.reserve(record, "m", CHARGE)
    await tenancy.close()  # shut down with the request still running
    ticket.record(prompt_tokens=20, completion_tokens=5)
    await tenancy.settle(ticket, failed=False, engine_s=0.0)
    assert len((tmp_path / "spool.jsonl").read_text().splitlines()) == 1
    again = Tenancy(SQLiteKeyStore(tmp_path / "k.sqlite3"), spool=tmp_path / "spool.jsonl")
    await again.start()  # replays it
    assert [r["requests"] for r in await again.store.usage("busy")] == [1]
    await again.close()


async def test_one_keys_allotment_is_never_anothers(clients: Clients) -> None:
    """Two tenants on one gateway: a busy key's allotments are charged to it alone, and the other key, quiet or
    busy, gets exactly its own limit whatever the first one does."""
    store = Counting(clients())
    busy, _ = new_record("busy", KeyPolicy(rpm=300, budget_tokens=1_000_000))
    other, _ = new_record("other", KeyPolicy(rpm=40, budget_tokens=1_000_000))
    await store.create(busy)
    await store.create(other)
    tenancy = await started(store)

    async def client(record: KeyRecord, n: int) -> int:
        return sum([await one(tenancy, record) for _ in range(n)])

    served = await asyncio.gather(client(busy, 400), client(other, 60))
    assert served == [300, 40]
    assert set(tenancy._allotted) <= {"busy", "other"}
    lim = Limits.of(other.policy, time.time())
    assert (await store.inner.reserve("other", lim, 0, "read")).refused == "requests"  # its own 40, no more
    await tenancy.close()
