"""Tenancy's background work under store faults, on a real SQLite store: the lease heartbeat keeps a
running request's slot, a settle that has to wait in the buffer stops renewing its lease (so the
slot comes back), and the usage flusher outlives any exception, not only StoreUnavailable."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.tenancy import service
from gateway.tenancy.keys import KeyPolicy, new_record
from gateway.tenancy.limits import Reservation
from gateway.tenancy.service import Refused, Tenancy
from gateway.tenancy.sqlite_store import SQLiteKeyStore
from gateway.tenancy.store import Settlement, StoreUnavailable

TTL_MS = 300


class FaultyStore:
    """A real store whose next settle calls raise the given exceptions, in order."""

    def __init__(self, inner: SQLiteKeyStore) -> None:
        self.inner = inner
        self.settle_faults: list[Exception] = []
        self.settle_calls = 0

    async def settle(self, settlements: list[Settlement]) -> None:
        self.settle_calls += 1
        if self.settle_faults:
            raise self.settle_faults.pop(0)
        await self.inner.settle(settlements)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def wait_for(done: Any, what: str, limit_s: float = 10.0) -> None:
    deadline = time.monotonic() + limit_s
    while not done():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


async def test_the_heartbeat_keeps_a_running_requests_slot(tmp_path: Path) -> None:
    record = new_record("hb", KeyPolicy(max_concurrency=1))[0]
    here = Tenancy(SQLiteKeyStore(tmp_path / "k.sqlite3", lease_ttl_ms=TTL_MS), lease_renew_s=TTL_MS / 4000)
    await here.store.create(record)  # a stored key: each reserve checks it is still active
    other = Tenancy(SQLiteKeyStore(tmp_path / "k.sqlite3", lease_ttl_ms=TTL_MS))  # another gateway on the file
    ticket = await here.reserve(record, "m", Reservation(1, 0))
    await asyncio.sleep(3 * TTL_MS / 1000)  # three expiries: only the heartbeat keeps it
    with pytest.raises(Refused):
        await other.reserve(record, "m", Reservation(1, 0))
    await here.settle(ticket, failed=False, engine_s=0.0)
    assert (await other.reserve(record, "m", Reservation(1, 0))).decision is not None
    await here.close()
    await other.close()


async def test_a_buffered_settle_lets_its_lease_expire_and_the_flush_writes_it_once(tmp_path: Path,
                                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "FLUSH_INTERVAL_S", 0.05)
    record = new_record("buf", KeyPolicy(max_concurrency=1))[0]
    store = FaultyStore(SQLiteKeyStore(tmp_path / "k.sqlite3", lease_ttl_ms=TTL_MS))
    here = Tenancy(store, lease_renew_s=TTL_MS / 4000)  # type: ignore[arg-type]
    await here.store.create(record)  # a stored key: each reserve checks it is still active
    other = Tenancy(SQLiteKeyStore(tmp_path / "k.sqlite3", lease_ttl_ms=TTL_MS))
    ticket = await here.reserve(record, "m", Reservation(1, 0))
    store.settle_faults = [StoreUnavailable("down")] * 1000  # the store stays down for the settle and the flushes
    ticket.record(3, 4)
    await here.settle(ticket, failed=False, engine_s=0.0)
    assert here.pending == 1
    await asyncio.sleep(TTL_MS / 1000 + 0.2)
    assert (await other.reserve(record, "m", Reservation(1, 0))).decision is not None  # no longer renewed: the slot came back
    store.settle_faults.clear()
    await wait_for(lambda: here.pending == 0, "the buffered settle was never written")
    rows = await other.store.usage("buf")
    assert [(r["requests"], r["prompt_tokens"], r["completion_tokens"]) for r in rows] == [(1, 3, 4)]
    await here.close()
    await other.close()


@pytest.mark.parametrize("fault", [RuntimeError("a store bug"), ValueError("bad reply"), KeyError("x")])
async def test_the_flusher_outlives_an_exception_other_than_store_unavailable(tmp_path: Path, fault: Exception,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "FLUSH_INTERVAL_S", 0.02)
    record = new_record("fl", KeyPolicy(rpm=100))[0]
    store = FaultyStore(SQLiteKeyStore(tmp_path / "k.sqlite3"))
    tenancy = Tenancy(store)  # type: ignore[arg-type]
    await tenancy.store.create(record)  # a stored key: each reserve checks it is still active
    ticket = await tenancy.reserve(record, "m", Reservation(1, 0))
    store.settle_faults = [StoreUnavailable("down"), fault, fault, StoreUnavailable("down"), fault]
    await tenancy.settle(ticket, failed=False, engine_s=0.0)  # buffered; then the flusher meets every fault
    assert tenancy.pending == 1
    await wait_for(lambda: tenancy.pending == 0, f"the flusher stopped after {type(fault).__name__}")
    assert store.settle_calls == 6
    assert [r["requests"] for r in await store.inner.usage("fl")] == [1]
    await tenancy.close()


async def test_a_settle_that_raises_something_else_keeps_the_usage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "FLUSH_INTERVAL_S", 0.02)
    record = new_record("ex", KeyPolicy(rpm=100))[0]
    store = FaultyStore(SQLiteKeyStore(tmp_path / "k.sqlite3"))
    tenancy = Tenancy(store)  # type: ignore[arg-type]
    await tenancy.store.create(record)  # a stored key: each reserve checks it is still active
    ticket = await tenancy.reserve(record, "m", Reservation(1, 0))
    store.settle_faults = [RuntimeError("first write")]
    await tenancy.settle(ticket, failed=False, engine_s=0.0)  # no exception reaches the request
    await wait_for(lambda: tenancy.pending == 0, "the usage was dropped")
    assert [r["requests"] for r in await store.inner.usage("ex")] == [1]
    await tenancy.close()


async def test_a_spool_written_before_request_ids_is_replayed_at_start(tmp_path: Path) -> None:
    import orjson

    spool = tmp_path / "usage-spool.jsonl"
    old = {"name": "old", "limits": None, "token_delta": 0, "release": False,  # the previous version's line: no request_id
           "usage": {"name": "old", "model": "m", "day": "2026-12-01", "requests": 2, "prompt_tokens": 5}}
    spool.write_bytes(orjson.dumps(old) + b"\n")
    tenancy = Tenancy(SQLiteKeyStore(tmp_path / "k.sqlite3"), spool=spool)
    await tenancy.start()
    assert not spool.exists()
    assert [(r["requests"], r["prompt_tokens"]) for r in await tenancy.store.usage("old")] == [(2, 5)]
    await tenancy.close()


class HeldSettles:
    """A real store whose settles wait until `go` is set (a slow write, a store busy elsewhere)."""

    def __init__(self, inner: SQLiteKeyStore) -> None:
        self.inner = inner
        self.go = asyncio.Event()

    async def settle(self, settlements: list[Settlement]) -> None:
        await self.go.wait()
        await self.inner.settle(settlements)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_keys_next_request_takes_its_slot_without_waiting_for_the_last_ones_settle(tmp_path: Path) -> None:
    """The reserve names the request whose settle is still unwritten (`released`): the store frees its slot in
    the reserve's own step. Before, the reserve waited for that write: a second round trip per request."""
    record = new_record("next", KeyPolicy(max_concurrency=1))[0]
    store = HeldSettles(SQLiteKeyStore(tmp_path / "k.sqlite3"))
    here = Tenancy(store)  # type: ignore[arg-type]
    await store.create(record)
    other = Tenancy(SQLiteKeyStore(tmp_path / "k.sqlite3"))  # another gateway on the file
    first = await here.reserve(record, "m", Reservation(1, 0))
    settling = asyncio.create_task(here.settle(first, failed=False, engine_s=0.0))
    for _ in range(5):
        await asyncio.sleep(0)
    assert here.pending == 1  # the settle is queued, its write held
    following = asyncio.create_task(here.reserve(record, "m", Reservation(1, 0)))
    for _ in range(50):
        if following.done():
            break
        await asyncio.sleep(0)
    assert following.done() and following.result().decision is not None and here.pending == 1
    with pytest.raises(Refused):  # one slot, and the second request holds it: never two
        await other.reserve(record, "m", Reservation(1, 0))
    store.go.set()
    await settling
    await here.settle(following.result(), failed=False, engine_s=0.0)
    assert (await other.reserve(record, "m", Reservation(1, 0))).decision is not None
    rows = await other.store.usage("next")
    assert [r["requests"] for r in rows] == [2]
    await here.close()
    await other.close()
