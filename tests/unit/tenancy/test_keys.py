"""Key records and their life in both stores: create, look up by hash, rotate, revoke; the file's
mode; usage kept while the store is down and spooled on shutdown."""

from __future__ import annotations

import stat
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gateway.tenancy.keys import KeyPolicy, hash_secret, new_record, rotated
from gateway.tenancy.limits import Reservation
from gateway.tenancy.redis_store import RedisKeyStore
from gateway.tenancy.service import Tenancy
from gateway.tenancy.sqlite_store import SQLiteKeyStore
from gateway.tenancy.store import KeyExists, KeyStore, StoreUnavailable
from tests.redis_server import RedisServer


@pytest_asyncio.fixture(params=["sqlite", "redis"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[KeyStore]:
    s: Any = (SQLiteKeyStore(tmp_path / "d" / "keys.sqlite3") if request.param == "sqlite"
              else RedisKeyStore(request.getfixturevalue("redis").url, f"t{uuid.uuid4().hex}:"))
    yield s
    await s.close()


async def test_key_lifecycle(store: KeyStore) -> None:
    assert not await store.auth_enabled()
    record, secret = new_record("team-a", KeyPolicy(rpm=5, models=("a",)))
    await store.create(record)
    assert await store.auth_enabled()
    assert (await store.lookup(hash_secret(secret))) == record
    with pytest.raises(KeyExists):
        await store.create(new_record("team-a", KeyPolicy())[0])
    new, new_secret = rotated(record)
    assert await store.replace_secret("team-a", new.secret_hash) == new
    assert await store.lookup(hash_secret(secret)) is None
    assert (await store.lookup(hash_secret(new_secret))) == new
    revoked = await store.revoke("team-a", 5.0)
    assert revoked is not None and revoked.revoked_at == 5.0
    assert await store.lookup(hash_secret(new_secret)) is None
    assert await store.revoke("team-a", 6.0) is None and await store.replace_secret("team-a", "x") is None
    assert await store.auth_enabled()  # revoking the last key does not turn authentication off
    assert [r.name for r in await store.list()] == ["team-a"]
    await store.create(new_record("team-a", KeyPolicy())[0])  # a revoked name may be taken again


def test_public_view_holds_no_secret_or_hash() -> None:
    record, secret = new_record("t", KeyPolicy(role="admin"))
    shown = repr(record.public())
    assert secret not in shown and record.secret_hash not in shown
    with pytest.raises(ValueError, match="key name"):
        new_record("bad name", KeyPolicy())


async def test_sqlite_file_is_private(tmp_path: Path) -> None:
    store = SQLiteKeyStore(tmp_path / "new" / "keys.sqlite3")
    await store.create(new_record("t", KeyPolicy())[0])
    for path in (store.path, Path(f"{store.path}-wal")):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE(store.path.parent.stat().st_mode) == 0o700
    await store.close()


async def test_usage_is_kept_while_the_store_is_down_and_spooled_at_shutdown(redis: RedisServer, tmp_path: Path) -> None:
    prefix = f"t{uuid.uuid4().hex}:"
    record, secret = new_record("u", KeyPolicy(rpm=100))
    await (seed := RedisKeyStore(redis.url, prefix)).create(record)
    await seed.close()
    spool = tmp_path / "spool.jsonl"
    tenancy = Tenancy(RedisKeyStore(redis.url, prefix, timeout_s=0.5), spool=spool)
    ticket = await tenancy.reserve(record, "m", Reservation(1, 0))
    redis.kill()
    try:
        ticket.record(3, 7)
        await tenancy.settle(ticket, failed=False, engine_s=0.1)  # no exception: kept
        assert tenancy.pending == 1
        with pytest.raises(StoreUnavailable):
            await tenancy.authenticate(secret.encode())
        with pytest.raises(StoreUnavailable):
            await tenancy.reserve(record, "m", Reservation(1, 0))
        await tenancy.close()  # still down: spooled
        assert spool.exists() and stat.S_IMODE(spool.stat().st_mode) == 0o600
    finally:
        redis.start()
    again = Tenancy(RedisKeyStore(redis.url, prefix), spool=spool)
    await again.start()
    assert not spool.exists()
    rows = await again.store.usage("u")
    assert [(r["requests"], r["prompt_tokens"], r["completion_tokens"], r["engine_ms"]) for r in rows] == [(1, 3, 7, 100)]
    await again.close()


async def test_fail_open_admits_known_keys_without_limits(redis: RedisServer) -> None:
    prefix = f"t{uuid.uuid4().hex}:"
    record, secret = new_record("o", KeyPolicy(rpm=1))
    tenancy = Tenancy(RedisKeyStore(redis.url, prefix, timeout_s=0.5), on_store_error="open")
    await tenancy.store.create(record)
    assert await tenancy.authenticate(secret.encode()) == record
    redis.kill()
    try:
        assert await tenancy.authenticate(secret.encode()) == record  # last known
        with pytest.raises(StoreUnavailable):
            await tenancy.authenticate(b"never-seen")
        ticket = await tenancy.reserve(record, "m", Reservation(1, 0))
        assert ticket.decision is None  # admitted, unlimited
    finally:
        redis.start()
    await tenancy.close()


async def test_a_locked_sqlite_file_is_waited_for_off_the_event_loop(tmp_path: Path) -> None:
    import asyncio
    import sqlite3

    from gateway.tenancy.limits import Limits

    store = SQLiteKeyStore(tmp_path / "keys.sqlite3")
    await store.create(new_record("t", KeyPolicy(rpm=5))[0])  # makes the file and the loop's connection
    other = sqlite3.connect(store.path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    ticks = 0

    async def ticking() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.create_task(ticking())
    asyncio.get_running_loop().call_later(0.3, other.rollback)
    decision = await store.reserve("t", Limits.of(KeyPolicy(rpm=5), 0.0), 1, "r1")
    ticker.cancel()
    assert decision.admitted and ticks >= 10  # the loop kept running while the reserve waited for the lock
    other.close()
    await store.close()


async def test_sqlite_writes_of_one_loop_turn_share_one_commit_and_none_returns_before_it(tmp_path: Path) -> None:
    import asyncio
    import sqlite3

    from gateway.tenancy.limits import Limits

    store = SQLiteKeyStore(tmp_path / "keys.sqlite3")
    policy = KeyPolicy(rpm=100, max_concurrency=100)
    await store.create(new_record("t", policy)[0])
    await store.reserve("t", Limits.of(policy, 0.0), 1, "warm")  # opens the loop's connection
    reader = sqlite3.connect(store.path, isolation_level=None)
    commits = store._commits
    seen_by_others: list[int] = []

    async def reserve(request_id: str) -> None:
        await store.reserve("t", Limits.of(policy, 0.0), 1, request_id)
        seen_by_others.append(int(reader.execute("SELECT count(*) FROM leases").fetchone()[0]))

    await asyncio.gather(*(reserve(f"r{i}") for i in range(8)))
    assert store._commits == commits + 2  # the first alone, at once; the seven that came in its turn together
    assert seen_by_others == [2] + [9] * 7  # none of the seven returned before all of them were committed
    reader.close()
    await store.close()


async def test_sqlite_shared_commits_never_hold_the_write_lock_between_two_steps_of_the_loop(tmp_path: Path) -> None:
    """Another gateway process on the same file must find the lock free whenever this one is not inside its
    one-step flush: a transaction left open across a turn of the loop would starve it under load."""
    import asyncio
    import sqlite3

    from gateway.tenancy.limits import Limits

    store = SQLiteKeyStore(tmp_path / "keys.sqlite3")
    policy = KeyPolicy(rpm=10**6, max_concurrency=10**6)
    await store.create(new_record("t", policy)[0])
    await store.reserve("t", Limits.of(policy, 0.0), 1, "warm")
    other = sqlite3.connect(store.path, timeout=0, isolation_level=None)  # never waits: "locked" is a failure
    stop = False

    async def reserving(worker: int) -> None:
        n = 0
        while not stop:
            n += 1
            await store.reserve("t", Limits.of(policy, 0.0), 1, f"w{worker}-{n}")

    workers = [asyncio.create_task(reserving(i)) for i in range(8)]
    try:
        for i in range(200):  # between the reserves' steps, as another process's writes would come
            await asyncio.sleep(0)
            other.execute("BEGIN IMMEDIATE")
            other.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('other', ?)", (str(i),))
            other.execute("COMMIT")
    finally:
        stop = True
        await asyncio.gather(*workers)
    other.close()
    await store.close()


async def test_a_sqlite_write_that_fails_rolls_back_its_whole_group_and_the_next_one_works(tmp_path: Path) -> None:
    import asyncio
    import sqlite3

    from gateway.tenancy.limits import Limits

    store = SQLiteKeyStore(tmp_path / "keys.sqlite3")
    policy = KeyPolicy(rpm=100)
    await store.create(new_record("t", policy)[0])
    await store.reserve("t", Limits.of(policy, 0.0), 1, "warm")

    def broken(db: sqlite3.Connection) -> None:
        db.execute("UPDATE windows SET count = count + 1000")
        raise sqlite3.OperationalError("disk I/O error")

    results = await asyncio.gather(store.reserve("t", Limits.of(policy, 0.0), 1, "alone"),
                                   store.reserve("t", Limits.of(policy, 0.0), 1, "mate"), store._write(broken),
                                   return_exceptions=True)
    assert [type(r).__name__ for r in results] == ["Decision", "StoreUnavailable", "StoreUnavailable"]
    after = await store.reserve("t", Limits.of(policy, 0.0), 1, "next")
    assert after.admitted and after.counters.requests == 3  # warm, alone, next: neither the mate nor the +1000
    await store.close()


async def test_a_sqlite_file_from_before_the_flag_with_only_revoked_keys_still_requires_keys(tmp_path: Path) -> None:
    import sqlite3

    import orjson

    path = tmp_path / "keys.sqlite3"
    record = new_record("gone", KeyPolicy(role="admin"))[0]
    old = sqlite3.connect(path)  # the previous version's schema: keys, no meta table
    old.execute("CREATE TABLE keys (name TEXT PRIMARY KEY, secret_hash TEXT UNIQUE, record BLOB NOT NULL)")
    old.execute("INSERT INTO keys VALUES (?, NULL, ?)", ("gone", orjson.dumps({**record.to_json(), "revoked_at": 1.0})))
    old.commit()
    old.close()
    store = SQLiteKeyStore(path)
    assert await store.auth_enabled()
    await store.disable_auth()
    assert not await store.auth_enabled()
    await store.close()
    assert not await (empty := SQLiteKeyStore(tmp_path / "none.sqlite3")).auth_enabled()
    await empty.close()


async def test_a_redis_store_from_before_the_flag_with_only_revoked_keys_still_requires_keys(redis: RedisServer) -> None:
    import orjson
    import redis as redis_client

    prefix = f"t{uuid.uuid4().hex}:"
    record = new_record("gone", KeyPolicy(role="admin"))[0]
    with redis_client.Redis.from_url(redis.url) as raw:  # what the previous version left: a revoked record, no flag
        raw.hset(prefix + "keys", "gone", orjson.dumps({**record.to_json(), "revoked_at": 1.0}))
    store = RedisKeyStore(redis.url, prefix)
    assert await store.auth_enabled()
    await store.disable_auth()
    assert not await store.auth_enabled()
    await store.close()


async def test_sqlite_forgets_applied_request_ids_after_a_day(tmp_path: Path) -> None:
    import sqlite3
    import time

    from gateway.tenancy.store import APPLIED_KEEP_MS, Settlement, UsageDelta

    store = SQLiteKeyStore(tmp_path / "keys.sqlite3")
    usage = UsageDelta("p", "m", "2026-12-01", requests=1)
    await store.settle([Settlement("old", "p", None, 0, False, usage)])
    db = sqlite3.connect(store.path)
    db.execute("UPDATE applied SET at_ms = ?", (int(time.time() * 1000) - APPLIED_KEEP_MS - 1,))
    db.commit()
    await store.close()
    store = SQLiteKeyStore(store.path)  # a gateway's first settle prunes (then one in PRUNE_EVERY)
    await store.settle([Settlement("new", "p", None, 0, False, usage)])
    assert [r[0] for r in db.execute("SELECT id FROM applied")] == ["s:new"]
    db.close()
    await store.close()


@pytest.mark.parametrize("fault", ["oom", "readonly"])
async def test_a_redis_error_reply_is_store_unavailable(redis: RedisServer, fault: str) -> None:
    import redis as redis_client

    from gateway.tenancy.limits import Limits
    from gateway.tenancy.store import Settlement, UsageDelta

    prefix = f"t{uuid.uuid4().hex}:"
    store = RedisKeyStore(redis.url, prefix, timeout_s=0.5)
    record, secret = new_record("f", KeyPolicy(max_concurrency=2))
    await store.create(record)
    assert (await store.reserve("f", Limits.of(record.policy, 0.0), 1, "r0")).admitted
    lim = Limits.of(record.policy, 0.0)
    raw = redis_client.Redis.from_url(redis.url)
    dead = __import__("adapters.process", fromlist=["free_port"]).free_port()
    raw.execute_command(*(("CONFIG", "SET", "maxmemory", "1") if fault == "oom" else ("REPLICAOF", "127.0.0.1", str(dead))))
    try:
        assert (await store.lookup(hash_secret(secret))) == record  # reads still answer
        for call in (lambda: store.reserve("f", lim, 1, "r1"), lambda: store.reserve("f", lim, 1, "r1", released=("r0",)),
                     lambda: store.create(new_record("g", KeyPolicy())[0]),
                     lambda: store.settle([Settlement("r0", "f", lim, 0, True, UsageDelta("f", "m", "2026-12-01"))])):
            with pytest.raises(StoreUnavailable, match="maxmemory|read only"):
                await call()
    finally:
        raw.execute_command(*(("CONFIG", "SET", "maxmemory", "0") if fault == "oom" else ("REPLICAOF", "NO", "ONE")))
        raw.close()
    assert (await store.reserve("f", lim, 1, "r1")).admitted
    await store.close()


async def test_pooled_connections_left_from_before_a_redis_restart_are_retried(redis: RedisServer) -> None:
    import asyncio

    from gateway.tenancy.limits import Limits

    prefix = f"t{uuid.uuid4().hex}:"
    store = RedisKeyStore(redis.url, prefix, timeout_s=0.5)
    record, secret = new_record("r", KeyPolicy(rpm=1000))
    await store.create(record)
    lim = Limits.of(record.policy, 0.0)

    async def burst(round_: int) -> list[str]:
        async def one(i: int) -> str:
            try:
                assert await store.lookup(hash_secret(secret)) == record
                return "ok" if (await store.reserve("r", lim, 1, f"{round_}-{i}")).admitted else "refused"
            except StoreUnavailable as exc:
                return str(exc)

        return await asyncio.gather(*(one(i) for i in range(10)))  # ten connections in the pool

    assert await burst(0) == ["ok"] * 10
    for round_ in (1, 2):
        redis.kill()
        redis.start()  # the same port, its data kept (append-only file): every pooled connection is dead
        assert await burst(round_) == ["ok"] * 10
    await store.close()
