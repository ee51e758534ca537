"""The service's key cache and batched settles on a real SQLite store: a cached key answers without a
store lookup, a revoke in this process or another on the file ends it, a lost (or never live) push
channel caches nothing, a push lost unseen is bounded by KEY_CACHE_MAX_AGE_S, a lookup in flight
across a change is not cached, and settles that arrive while a write is in flight share the next one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.tenancy import service
from gateway.tenancy.keys import KeyPolicy, new_record
from gateway.tenancy.limits import Reservation
from gateway.tenancy.service import KeyRevoked, Tenancy
from gateway.tenancy.sqlite_store import SQLiteKeyStore
from gateway.tenancy.store import Settlement


class Counting:
    """A real store that counts lookups and settle calls; `push=False`: its watch says live and never
    tells a change (a push channel lost without anyone seeing it)."""

    def __init__(self, inner: SQLiteKeyStore, push: bool = True) -> None:
        self.inner = inner
        self.push = push
        self.lookups = 0
        self.settles: list[int] = []
        self.hold: asyncio.Event | None = None
        self.changed: Callable[[bool], None] | None = None

    async def lookup(self, secret_hash: str) -> Any:
        self.lookups += 1
        if self.hold is not None:
            await self.hold.wait()
        return await self.inner.lookup(secret_hash)

    async def settle(self, settlements: list[Settlement]) -> None:
        self.settles.append(len(settlements))
        await asyncio.sleep(0.01)  # a round trip, during which other settles queue
        await self.inner.settle(settlements)

    async def watch(self, changed: Callable[[bool], None]) -> None:
        self.changed = changed
        if self.push:
            await self.inner.watch(changed)
        else:
            changed(True)
            await asyncio.Event().wait()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def wait_for(done: Callable[[], Any], what: str) -> None:
    deadline = time.monotonic() + 10  # a hang guard, not a latency bound
    while not await done():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


async def started(store: Counting) -> Tenancy:
    tenancy = Tenancy(store)  # type: ignore[arg-type]
    await tenancy.start()
    await wait_for(lambda: asyncio.sleep(0, tenancy._cache_live), "the watch never went live")
    return tenancy


async def test_a_cached_key_needs_no_lookup_and_a_revoke_here_ends_it_at_once(tmp_path: Path) -> None:
    store = Counting(SQLiteKeyStore(tmp_path / "k.sqlite3"))
    record, secret = new_record("c", KeyPolicy())
    await store.create(record)
    tenancy = await started(store)
    assert (await tenancy.authenticate(secret.encode())) is not None
    assert (await tenancy.authenticate(secret.encode())) is not None
    assert store.lookups == 1
    await store.revoke("c", time.time())  # this process's own revoke: no wait at all
    assert await tenancy.authenticate(secret.encode()) is None
    await tenancy.close()


async def test_a_revoke_by_another_process_on_the_file_ends_the_cached_key(tmp_path: Path) -> None:
    store = Counting(SQLiteKeyStore(tmp_path / "k.sqlite3"))
    record, secret = new_record("c", KeyPolicy())
    await store.create(record)
    tenancy = await started(store)
    assert (await tenancy.authenticate(secret.encode())) is not None
    other = SQLiteKeyStore(tmp_path / "k.sqlite3")  # `enginegate keys revoke`, or another gateway
    await other.revoke("c", time.time())
    await wait_for(lambda: _refused(tenancy, secret), "the other process's revoke never reached the cache")
    await other.close()
    await tenancy.close()


async def _refused(tenancy: Tenancy, secret: str) -> bool:
    return await tenancy.authenticate(secret.encode()) is None


async def test_nothing_is_cached_without_a_live_push_channel(tmp_path: Path) -> None:
    store = Counting(SQLiteKeyStore(tmp_path / "k.sqlite3"))
    record, secret = new_record("c", KeyPolicy())
    await store.create(record)
    unstarted = Tenancy(store)  # type: ignore[arg-type]  # no watch at all
    for _ in range(3):
        assert await unstarted.authenticate(secret.encode()) is not None
    assert store.lookups == 3
    tenancy = await started(store)
    assert store.changed is not None
    store.changed(False)  # the channel lost: what was cached goes, nothing new is cached
    for _ in range(3):
        assert await tenancy.authenticate(secret.encode()) is not None
    assert store.lookups == 6
    await tenancy.close()


async def test_a_push_lost_unseen_keeps_a_revoked_key_no_longer_than_the_max_age(tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "KEY_CACHE_MAX_AGE_S", 0.3)
    store = Counting(SQLiteKeyStore(tmp_path / "k.sqlite3"), push=False)
    record, secret = new_record("c", KeyPolicy())
    await store.create(record)
    tenancy = await started(store)
    assert await tenancy.authenticate(secret.encode()) is not None
    looked_up = time.monotonic()  # the entry is at most this old
    await store.inner.revoke("c", time.time())  # nobody tells the cache
    while True:
        asked = time.monotonic()
        if await tenancy.authenticate(secret.encode()) is None:
            break
        assert asked - looked_up < 0.3, "a cached key outlived KEY_CACHE_MAX_AGE_S"
        await asyncio.sleep(0.02)
    await tenancy.close()


async def test_a_lookup_in_flight_when_a_key_changes_is_not_cached(tmp_path: Path) -> None:
    store = Counting(SQLiteKeyStore(tmp_path / "k.sqlite3"), push=False)
    record, secret = new_record("c", KeyPolicy())
    await store.create(record)
    tenancy = await started(store)
    store.hold = asyncio.Event()
    pending = asyncio.create_task(tenancy.authenticate(secret.encode()))
    await asyncio.sleep(0.05)
    assert store.changed is not None
    store.changed(True)  # a revoke pushed while the lookup was on its way: its answer may predate it
    store.hold.set()
    assert await pending is not None
    assert await tenancy.authenticate(secret.encode()) is not None
    assert store.lookups == 2
    await tenancy.close()


async def test_settles_queued_during_a_write_go_in_one_store_call_and_every_one_is_written(tmp_path: Path) -> None:
    store = Counting(SQLiteKeyStore(tmp_path / "k.sqlite3"))
    record, _ = new_record("b", KeyPolicy(rpm=10**6, max_concurrency=100))
    await store.create(record)
    tenancy = Tenancy(store)  # type: ignore[arg-type]
    tickets = [await tenancy.reserve(record, "m", Reservation(1, 0)) for _ in range(40)]
    await asyncio.gather(*(tenancy.settle(t, failed=False, engine_s=0.0) for t in tickets))
    assert sum(store.settles) == 40 and len(store.settles) < 40
    rows = await store.usage("b")
    assert [r["requests"] for r in rows] == [40]
    again = [await tenancy.reserve(record, "m", Reservation(1, 0)) for _ in range(100)]  # every slot came back
    assert all(t.decision is not None for t in again)
    await tenancy.close()


async def test_a_limited_key_revoked_while_cached_is_refused_by_its_reserve_whatever_the_push(tmp_path: Path) -> None:
    store = Counting(SQLiteKeyStore(tmp_path / "k.sqlite3"), push=False)  # the push lost: the cache is stale
    record, secret = new_record("lim", KeyPolicy(rpm=100))
    await store.create(record)
    tenancy = await started(store)
    cached = await tenancy.authenticate(secret.encode())
    assert cached is not None
    await store.inner.revoke("lim", time.time())
    stale = await tenancy.authenticate(secret.encode())
    assert stale is not None  # the cache has not heard...
    with pytest.raises(KeyRevoked):  # ...but the reserve checks the key in the store, in its one round trip
        await tenancy.reserve(stale, "m", Reservation(1, 0))
    assert await tenancy.authenticate(secret.encode()) is None  # and the stale entry is gone
    assert [r["requests"] for r in await store.usage("lim")] == []  # nothing charged
    await tenancy.close()
