"""The embedded key store: one SQLite file (WAL), 0600 in a 0700 folder.

Concurrency: each limit decision is made inside a `BEGIN IMMEDIATE` transaction, so several gateway
processes on the same file never both take the last unit of a limit. The hot path (key lookup,
reserve, settle) runs on the event loop's own connection, which never waits: in WAL mode a read
never waits for a writer; a write that finds the file locked (busy timeout 0) is handed to the
worker thread, which waits for the lock there; commits do not fsync (synchronous=NORMAL) and the
WAL checkpoint (which does) runs on the worker thread. A thread hop per call cost more than the
queries themselves (benchmarks/tenancy_overhead.py). The writes of one turn of the event loop share
one transaction, made in one step at the next turn, before any of them returns (`_flush_writes`):
under load the commit, which rewrites the WAL pages the counters live on, was a third of a reserve.

Accounting is idempotent: `applied` holds the request ids already reserved (`r:ID`) and settled
(`s:ID`), pruned after APPLIED_KEEP_MS; a concurrency slot is a row of `leases` that expires
unless renewed. `meta` holds "keys are on" (`auth`: 1 or 0); a file written before it existed
counts as on when it holds any key record, revoked or not.

Key changes (`watch`): a revoke or rotation adds one to `meta`'s `keys_version` in its transaction and
tells this process's watcher at once; the watcher reads the counter every WATCH_POLL_S on the loop's
connection (`PRAGMA data_version` first: nothing else is read while no other connection committed),
so another process's change (`enginegate keys revoke`, another gateway) is seen within WATCH_POLL_S."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import orjson

from gateway.sqlite_wal import is_locked, switch_to_wal
from gateway.tenancy.keys import KeyRecord
from gateway.tenancy.limits import Counters, Decision, Limits, check
from gateway.tenancy.store import (
    APPLIED_KEEP_MS,
    LEASE_TTL_MS,
    USAGE_FIELDS,
    Grant,
    KeyExists,
    KeysActive,
    Settlement,
    StoreUnavailable,

)

T = TypeVar("T")
BUSY_TIMEOUT_S = 5.0
PRUNE_EVERY = 256  # settle transactions between two prunings of the applied request ids (the first one prunes)
WATCH_POLL_S = 0.1
"""How often the key watch looks for another process's key change (one PRAGMA data_version when there is none)."""
CHECKPOINT_EVERY = 256  # commits on the loop's connection between two checkpoints (on the worker thread)
SCHEMA = """
CREATE TABLE IF NOT EXISTS keys (
    name TEXT PRIMARY KEY,
    secret_hash TEXT UNIQUE,
    record BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS windows (
    name TEXT NOT NULL, kind TEXT NOT NULL, started_ms INTEGER NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (name, kind)
);
CREATE TABLE IF NOT EXISTS leases (
    name TEXT NOT NULL, request_id TEXT NOT NULL, expires_ms INTEGER NOT NULL, PRIMARY KEY (name, request_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS applied (id TEXT PRIMARY KEY, at_ms INTEGER NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS applied_at ON applied (at_ms);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS budgets (
    name TEXT NOT NULL, period TEXT NOT NULL, used INTEGER NOT NULL, PRIMARY KEY (name, period)
);
CREATE TABLE IF NOT EXISTS usage (
    name TEXT NOT NULL, model TEXT NOT NULL, day TEXT NOT NULL,
    requests INTEGER NOT NULL DEFAULT 0, prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0, errors INTEGER NOT NULL DEFAULT 0,
    rejected INTEGER NOT NULL DEFAULT 0, engine_ms INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (name, day, model)
);
"""


_BUMP_KEYS = ("INSERT INTO meta (key, value) VALUES ('keys_version', '1') ON CONFLICT (key) "
              "DO UPDATE SET value = CAST(CAST(value AS INTEGER) + 1 AS TEXT)")
_SET_AUTH = "INSERT INTO meta (key, value) VALUES ('auth', ?1) ON CONFLICT (key) DO UPDATE SET value = ?1"


_ADD_WINDOW = ("INSERT INTO windows (name, kind, started_ms, count) VALUES (?1, ?2, ?3, max(?4, 0)) "
               "ON CONFLICT (name, kind) DO UPDATE SET "
               "count = CASE WHEN ?3 - started_ms >= ?5 THEN max(?4, 0) ELSE max(count + ?4, 0) END, "
               "started_ms = CASE WHEN ?3 - started_ms >= ?5 THEN ?3 ELSE started_ms END")
"""Add n (?4) to one window (?2) of a tenant (?1) at ?3 (ms); a window older than ?5 ms starts again at ?3."""
_ADD_WINDOWS = ("INSERT INTO windows (name, kind, started_ms, count) VALUES (?1, 'requests', ?2, max(?3, 0)), "
                "(?1, 'tokens', ?2, max(?4, 0)) ON CONFLICT (name, kind) DO UPDATE SET "
                "count = CASE WHEN ?2 - started_ms >= ?5 THEN max(excluded.count, 0) "
                "ELSE max(count + excluded.count, 0) END, "
                "started_ms = CASE WHEN ?2 - started_ms >= ?5 THEN ?2 ELSE started_ms END")
"""Both windows of a tenant in one statement: ?3 requests and ?4 tokens at ?2 (ms), windows of ?5 ms."""


def default_keys_path() -> Path:
    """$XDG_DATA_HOME/enginegate/keys.sqlite3, beside the response store: `enginegate keys` and `serve` agree."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "enginegate" / "keys.sqlite3"


def private_file(path: Path) -> None:
    """Create the folder 0700 (when new) and the file 0600, before SQLite opens it (its -wal and
    -shm files take the file's mode)."""
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)
    os.chmod(path, 0o600)


@dataclass(slots=True)
class _Write:
    """One queued write: its body and the caller's future (a caller that leaves cancels its own only)."""

    body: Callable[[sqlite3.Connection], Any]
    done: asyncio.Future[Any]


def _transaction(db: sqlite3.Connection, body: Callable[[sqlite3.Connection], T]) -> T:
    db.execute("BEGIN IMMEDIATE")
    try:
        out = body(db)
    except BaseException:
        db.rollback()
        raise
    db.commit()
    return out


class SQLiteKeyStore:
    def __init__(self, path: Path, lease_ttl_ms: int = LEASE_TTL_MS) -> None:
        self.path = path
        self.lease_ttl_ms = lease_ttl_ms
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="enginegate-keys")
        self._db: sqlite3.Connection | None = None
        self._loop_db: sqlite3.Connection | None = None
        self._commits = 0
        self._queued: list[_Write] | None = None  # this turn's writes, flushed at the next (_flush_writes)
        self._worker_writes: set[asyncio.Future[None]] = set()
        self._settles = 0
        self._changed: Callable[[bool], None] | None = None
        self._closed = False

    # -- the worker thread -------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            private_file(self.path)
            db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
            switch_to_wal(db, BUSY_TIMEOUT_S)
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(SCHEMA)
            self._db = db
        return self._db

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        def call() -> T:
            try:
                return fn(*args)
            except (sqlite3.Error, OSError) as exc:
                if self._db is not None and self._db.in_transaction:
                    self._db.rollback()
                raise StoreUnavailable(f"key store {self.path}: {exc}") from exc

        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def _tx(self, body: Callable[[sqlite3.Connection], T]) -> T:
        return _transaction(self._conn(), body)

    # -- keys --------------------------------------------------------------------------------
    def _loop_conn(self) -> sqlite3.Connection | None:
        """The event loop's connection, once the worker thread has made the file and its schema: never waits for a lock."""
        if self._loop_db is None:
            if self._db is None:
                return None
            db = sqlite3.connect(self.path, timeout=0, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA wal_autocheckpoint=0")  # checkpoints fsync: the worker thread does them
            self._loop_db = db
        return self._loop_db

    async def _write(self, body: Callable[[sqlite3.Connection], T]) -> T:
        """`body` in a transaction on the loop's connection. The first write since the last flush is made at once
        and alone (no wait at all when requests come one at a time); the writes that follow it in the same turn
        of the event loop are queued for one shared transaction at the next turn (`_flush_writes`), and each
        returns once that is committed. With no file yet, or a file another process is writing, on the worker
        thread, which waits for the lock there."""
        db = self._loop_conn()
        if db is None:
            return await self._run(self._tx, body)
        loop = asyncio.get_running_loop()
        if self._queued is not None:
            write = _Write(body, loop.create_future())
            self._queued.append(write)
            return await write.done  # type: ignore[no-any-return]
        self._queued = []
        loop.call_soon(self._flush_writes)
        try:
            out = _transaction(db, body)
        except sqlite3.OperationalError as exc:
            if not is_locked(exc):
                self._loop_db = None
                raise StoreUnavailable(f"key store {self.path}: {exc}") from exc
        except sqlite3.Error as exc:
            self._loop_db = None
            raise StoreUnavailable(f"key store {self.path}: {exc}") from exc
        else:
            self._committed()
            return out
        return await self._run(self._tx, body)

    def _committed(self) -> None:
        self._commits += 1
        if self._commits % CHECKPOINT_EVERY == 0:
            self._executor.submit(self._checkpoint)

    def _flush_writes(self) -> None:
        """The writes queued in the last turn of the event loop, in one transaction on the loop's connection, in one
        step (the file's write lock is held only for their statements, never across other work): the reserves
        and settles of requests that arrived together share one BEGIN IMMEDIATE and one commit, which rewrites
        the WAL pages the counters live on once. None returns before the commit; if one fails, all roll back
        and each gets the store's error. A locked file (another process writes) sends them, still in one
        transaction, to the worker thread, which waits for the lock there. A write whose caller left before
        the step is not made."""
        writes, self._queued = [w for w in self._queued or () if not w.done.done()], None
        if not writes:
            return
        db = self._loop_conn()  # None: closed meanwhile (the worker thread reopens the file)
        if db is not None:
            try:
                db.execute("BEGIN IMMEDIATE")  # busy timeout 0: "locked" at once when another connection writes
            except sqlite3.OperationalError as exc:
                if not is_locked(exc):
                    self._loop_db = None
                    self._fail(writes, exc)
                    return
                db = None
            except sqlite3.Error as exc:
                self._loop_db = None
                self._fail(writes, exc)
                return
        if db is None:
            task = asyncio.ensure_future(self._write_on_worker(writes))
            self._worker_writes.add(task)
            task.add_done_callback(self._worker_writes.discard)
            return
        try:
            results = [w.body(db) for w in writes]
            db.commit()
        except Exception as exc:
            with contextlib.suppress(sqlite3.Error):
                db.rollback()
            if isinstance(exc, sqlite3.Error):
                self._loop_db = None
            self._fail(writes, exc)
            return
        self._deliver(writes, results)
        self._committed()

    async def _write_on_worker(self, writes: list[_Write]) -> None:
        try:
            results = await self._run(self._tx, lambda db: [w.body(db) for w in writes])
        except Exception as exc:
            self._fail(writes, exc)
            return
        self._deliver(writes, results)

    @staticmethod
    def _deliver(writes: list[_Write], results: list[Any]) -> None:
        for w, out in zip(writes, results, strict=True):
            if not w.done.done():
                w.done.set_result(out)

    def _fail(self, writes: list[_Write], exc: Exception) -> None:
        error = exc if isinstance(exc, StoreUnavailable) or not isinstance(exc, sqlite3.Error) else \
            StoreUnavailable(f"key store {self.path}: {exc}")
        for w in writes:
            if not w.done.done():
                w.done.set_exception(error)

    def _checkpoint(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._conn().execute("PRAGMA wal_checkpoint(PASSIVE)")

    async def lookup(self, secret_hash: str) -> KeyRecord | None:
        sql = "SELECT record FROM keys WHERE secret_hash = ?"
        try:
            db = self._loop_conn()
            if db is None:
                return await self._run(self._one, sql, secret_hash)
            row = db.execute(sql, (secret_hash,)).fetchone()
        except sqlite3.OperationalError as exc:
            if not is_locked(exc):
                self._loop_db = None
                raise StoreUnavailable(f"key store {self.path}: {exc}") from exc
            return await self._run(self._one, sql, secret_hash)  # rare for a WAL read: wait on the thread
        except sqlite3.Error as exc:
            self._loop_db = None
            raise StoreUnavailable(f"key store {self.path}: {exc}") from exc
        return KeyRecord.from_json(orjson.loads(row[0])) if row else None

    async def get(self, name: str) -> KeyRecord | None:
        return await self._run(self._one, "SELECT record FROM keys WHERE name = ?", name)

    def _one(self, sql: str, arg: str) -> KeyRecord | None:
        row = self._conn().execute(sql, (arg,)).fetchone()
        return KeyRecord.from_json(orjson.loads(row[0])) if row else None

    async def auth_enabled(self) -> bool:
        def run() -> bool:
            if self._db is None and not self.path.exists():
                return False  # nothing made yet: no file is created until a key or a usage record is written
            db = self._conn()
            row = db.execute("SELECT value FROM meta WHERE key = 'auth'").fetchone()
            if row is not None:
                return bool(row[0] == "1")
            return db.execute("SELECT 1 FROM keys LIMIT 1").fetchone() is not None  # a file from before the flag

        return await self._run(run)

    async def disable_auth(self) -> None:
        def body(db: sqlite3.Connection) -> None:
            row = db.execute("SELECT name FROM keys WHERE secret_hash IS NOT NULL ORDER BY name LIMIT 1").fetchone()
            if row is not None:
                raise KeysActive(row[0])
            db.execute(_SET_AUTH, ("0",))

        await self._run(self._tx, body)

    async def list(self) -> list[KeyRecord]:
        def run() -> list[KeyRecord]:
            if self._db is None and not self.path.exists():
                return []
            return [KeyRecord.from_json(orjson.loads(r[0])) for r in self._conn().execute("SELECT record FROM keys ORDER BY name")]

        return await self._run(run)

    async def create(self, record: KeyRecord) -> None:
        def body(db: sqlite3.Connection) -> None:
            row = db.execute("SELECT secret_hash FROM keys WHERE name = ?", (record.name,)).fetchone()
            if row is not None and row[0] is not None:
                raise KeyExists(record.name)
            db.execute("INSERT OR REPLACE INTO keys (name, secret_hash, record) VALUES (?, ?, ?)",
                       (record.name, record.secret_hash, orjson.dumps(record.to_json())))
            db.execute(_SET_AUTH, ("1",))

        await self._run(self._tx, body)

    async def revoke(self, name: str, at: float) -> KeyRecord | None:
        return await self._change_key(lambda db: self._update(db, name, lambda r: replace(r, revoked_at=at), None))

    async def replace_secret(self, name: str, secret_hash: str) -> KeyRecord | None:
        return await self._change_key(lambda db: self._update(db, name, lambda r: replace(r, secret_hash=secret_hash),
                                                              secret_hash))

    async def _change_key(self, body: Callable[[sqlite3.Connection], KeyRecord | None]) -> KeyRecord | None:
        try:
            return await self._run(self._tx, body)
        finally:  # even when it failed: it may have committed
            if self._changed is not None:
                self._changed(True)

    def _keys_version(self, last_data_version: int | None) -> tuple[int, str | None]:
        """(data_version, keys_version) read on the loop's connection; keys_version None: not read (nothing
        committed by another connection since `last_data_version`)."""
        db = self._loop_conn()
        assert db is not None
        data_version = int(db.execute("PRAGMA data_version").fetchone()[0])
        if data_version == last_data_version:
            return data_version, None
        row = db.execute("SELECT value FROM meta WHERE key = 'keys_version'").fetchone()
        return data_version, str(row[0]) if row else "0"

    async def watch(self, changed: Callable[[bool], None]) -> None:
        self._changed = changed
        live = False
        data_version: int | None = None
        keys_version: str | None = None
        try:
            while True:
                try:
                    if self._loop_conn() is None and self.path.exists():
                        await self._run(self._conn)  # the file exists (another process made it): open it here too
                    if self._loop_conn() is None:
                        now: str | None = "absent"  # no file: no key to cache; a change makes the file
                    else:
                        data_version, now = self._keys_version(data_version)
                        if now is None:
                            now = keys_version
                    if not live or now != keys_version:
                        keys_version, live = now, True
                        changed(True)
                except (sqlite3.Error, OSError, StoreUnavailable):
                    self._loop_db = None
                    data_version = keys_version = None
                    if live:
                        live = False
                        changed(False)
                await asyncio.sleep(WATCH_POLL_S)
        finally:
            self._changed = None

    @staticmethod
    def _update(db: sqlite3.Connection, name: str, change: Callable[[KeyRecord], KeyRecord],
                new_hash: str | None) -> KeyRecord | None:
        row = db.execute("SELECT record, secret_hash FROM keys WHERE name = ?", (name,)).fetchone()
        if row is None or row[1] is None:
            return None  # unknown or already revoked
        record = change(KeyRecord.from_json(orjson.loads(row[0])))
        db.execute("UPDATE keys SET secret_hash = ?, record = ? WHERE name = ?",
                   (new_hash, orjson.dumps(record.to_json()), name))
        db.execute(_BUMP_KEYS)
        return record

    # -- limits ------------------------------------------------------------------------------
    async def reserve(self, name: str, limits: Limits, cost: int, request_id: str,
                      secret_hash: str | None = None, released: Sequence[str] = ()) -> Decision:
        return await self._write(lambda db: self._reserve(db, name, limits, cost, request_id, secret_hash, released))

    async def grant(self, name: str, limits: Limits, requests: int, unit_cost: int,
                    secret_hash: str | None = None) -> Grant:
        return await self._write(lambda db: self._grant(db, name, replace(limits, concurrency=None), requests,
                                                        unit_cost, secret_hash))

    def _grant(self, db: sqlite3.Connection, name: str, limits: Limits, requests: int, unit_cost: int,
               secret_hash: str | None) -> Grant:
        """The counters read once, each request decided by `check` in order as `_reserve` would, the total written
        once (no applied ids: a grant is never replayed, its ids are new each time)."""
        if not self._active(db, name, secret_hash):
            return Grant(0, Decision(limits, Counters(), "revoked"))
        now_ms = int(time.time() * 1000)
        found = counters = self._counters(db, name, limits, now_ms)
        granted = 0
        while granted < requests:
            refused = check(limits, counters, unit_cost)
            if refused is not None:
                if not granted:
                    return Grant(0, Decision(limits, counters, refused))
                break
            granted += 1
            counters = replace(found, requests=found.requests + granted if limits.rpm else 0,
                               tokens=found.tokens + granted * unit_cost if limits.tpm else 0,
                               budget_used=found.budget_used + granted * unit_cost if limits.budget else 0)
        self._charge(db, name, limits, now_ms, granted, granted * unit_cost)
        return Grant(granted, Decision(limits, counters))

    @staticmethod
    def _active(db: sqlite3.Connection, name: str, secret_hash: str | None) -> bool:
        """`name` is still an active key under `secret_hash` (None: not checked)."""
        return secret_hash is None or db.execute("SELECT 1 FROM keys WHERE name = ? AND secret_hash = ?",
                                                 (name, secret_hash)).fetchone() is not None

    def _counters(self, db: sqlite3.Connection, name: str, limits: Limits, now_ms: int) -> Counters:
        """What the key's limits count now (0 for a limit it does not have): its windows, live leases, budget."""
        requests = requests_reset = tokens = tokens_reset = 0
        if limits.rpm or limits.tpm:
            requests, requests_reset, tokens, tokens_reset = self._windows(db, name, limits, now_ms)
            if not limits.rpm:
                requests = requests_reset = 0
            if not limits.tpm:
                tokens = tokens_reset = 0
        inflight = 0
        if limits.concurrency:  # live leases only: the expired ones (a killed gateway's) are pruned with the settles
            inflight = int(db.execute("SELECT count(*) FROM leases WHERE name = ? AND expires_ms > ?",
                                      (name, now_ms)).fetchone()[0])
        used = 0
        if limits.budget:
            row = db.execute("SELECT used FROM budgets WHERE name = ? AND period = ?", (name, limits.budget_period)).fetchone()
            used = int(row[0]) if row else 0
        return Counters(requests, requests_reset, tokens, tokens_reset, inflight, used)

    def _charge(self, db: sqlite3.Connection, name: str, limits: Limits, now_ms: int, requests: int, tokens: int) -> None:
        """Add `requests` and `tokens` to the key's windows and budget (those it has)."""
        if limits.rpm and limits.tpm:
            db.execute(_ADD_WINDOWS, (name, now_ms, requests, tokens, limits.window_ms))
        elif limits.rpm:
            self._add_window(db, name, "requests", now_ms, limits.window_ms, requests)
        elif limits.tpm:
            self._add_window(db, name, "tokens", now_ms, limits.window_ms, tokens)
        if limits.budget:
            self._add_budget(db, name, limits.budget_period, tokens)

    @staticmethod
    def _windows(db: sqlite3.Connection, name: str, limits: Limits, now_ms: int) -> tuple[int, int, int, int]:
        """(requests, ms until that window resets, tokens, ms until that one resets), in one read; an ended
        window counts 0."""
        window_ms = limits.window_ms
        found = {kind: (0, window_ms) for kind in ("requests", "tokens")}
        for kind, started_ms, count in db.execute("SELECT kind, started_ms, count FROM windows WHERE name = ? "
                                                   "AND kind IN ('requests', 'tokens')", (name,)):
            if now_ms - started_ms < window_ms:
                found[kind] = (int(count), int(started_ms + window_ms - now_ms))
        return (*found["requests"], *found["tokens"])

    @staticmethod
    def _add_window(db: sqlite3.Connection, name: str, kind: str, now_ms: int, window_ms: int, n: int) -> None:
        db.execute(_ADD_WINDOW, (name, kind, now_ms, n, window_ms))

    def _reserve(self, db: sqlite3.Connection, name: str, limits: Limits, cost: int, request_id: str,
                 secret_hash: str | None, released: Sequence[str]) -> Decision:
        if not self._active(db, name, secret_hash):
            return Decision(limits, Counters(), "revoked")
        if released:
            db.executemany("DELETE FROM leases WHERE name = ? AND request_id = ?", [(name, r) for r in released])
        now_ms = int(time.time() * 1000)
        applied = "r:" + request_id
        replay = db.execute("INSERT OR IGNORE INTO applied (id, at_ms) VALUES (?, ?)", (applied, now_ms)).rowcount == 0
        found = self._counters(db, name, limits, now_ms)
        if replay:
            return Decision(limits, found)  # charged once already: admitted as it was
        refused = check(limits, found, cost)
        if refused is not None:
            db.execute("DELETE FROM applied WHERE id = ?", (applied,))  # not charged: its replay is decided afresh
            return Decision(limits, found, refused)
        self._charge(db, name, limits, now_ms, 1, cost)
        if limits.concurrency:
            db.execute("INSERT OR REPLACE INTO leases (name, request_id, expires_ms) VALUES (?, ?, ?)",
                       (name, request_id, now_ms + self.lease_ttl_ms))
        return Decision(limits, replace(found, requests=found.requests + 1, tokens=found.tokens + cost,
                                        inflight=found.inflight + 1, budget_used=found.budget_used + cost))

    @staticmethod
    def _add_budget(db: sqlite3.Connection, name: str, period: str, n: int) -> None:
        db.execute("INSERT INTO budgets (name, period, used) VALUES (?, ?, max(?3, 0)) ON CONFLICT (name, period) "
                   "DO UPDATE SET used = max(used + ?3, 0)", (name, period, n))

    async def settle(self, settlements: list[Settlement]) -> None:
        def body(db: sqlite3.Connection) -> None:
            now_ms = int(time.time() * 1000)
            self._settles += 1
            if self._settles % PRUNE_EVERY == 1:
                db.execute("DELETE FROM applied WHERE at_ms < ?", (now_ms - APPLIED_KEEP_MS,))
                db.execute("DELETE FROM leases WHERE expires_ms <= ?", (now_ms,))  # a killed gateway's, unrenewed
            for s in settlements:
                if db.execute("INSERT OR IGNORE INTO applied (id, at_ms) VALUES (?, ?)",
                              ("s:" + s.request_id, now_ms)).rowcount == 0:
                    continue  # applied before (a replay after a timeout, or a spool written twice)
                if s.release:
                    db.execute("DELETE FROM leases WHERE name = ? AND request_id = ?", (s.name, s.request_id))
                limits = s.limits
                if limits is not None:
                    if s.token_delta and limits.tpm:
                        self._add_window(db, s.name, "tokens", now_ms, limits.window_ms, s.token_delta)
                    if s.token_delta and limits.budget:
                        self._add_budget(db, s.name, limits.budget_period, s.token_delta)
                u = s.usage
                values = [getattr(u, f) for f in USAGE_FIELDS]
                db.execute(f"INSERT INTO usage (name, model, day, {', '.join(USAGE_FIELDS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                           "ON CONFLICT (name, day, model) DO UPDATE SET "
                           + ", ".join(f"{f} = {f} + excluded.{f}" for f in USAGE_FIELDS),
                           (u.name, u.model, u.day, *values))

        await self._write(body)

    async def renew(self, leases: list[tuple[str, str]]) -> None:
        if not leases:
            return

        def body(db: sqlite3.Connection) -> None:
            now_ms = int(time.time() * 1000)
            db.executemany("UPDATE leases SET expires_ms = ? WHERE name = ? AND request_id = ? AND expires_ms > ?",
                           [(now_ms + self.lease_ttl_ms, name, rid, now_ms) for name, rid in leases])

        await self._write(body)

    async def release_leases(self, name: str) -> int:
        def body(db: sqlite3.Connection) -> int:
            now_ms = int(time.time() * 1000)
            live = int(db.execute("SELECT count(*) FROM leases WHERE name = ? AND expires_ms > ?", (name, now_ms)).fetchone()[0])
            db.execute("DELETE FROM leases WHERE name = ?", (name,))
            return live

        return await self._run(self._tx, body)

    async def usage(self, name: str | None = None, since: str | None = None) -> list[dict[str, Any]]:
        def run() -> list[dict[str, Any]]:
            if self._db is None and not self.path.exists():
                return []
            rows = self._conn().execute(
                f"SELECT name, model, day, {', '.join(USAGE_FIELDS)} FROM usage WHERE (?1 IS NULL OR name = ?1) "
                "AND (?2 IS NULL OR day >= ?2) ORDER BY day, name, model", (name, since)).fetchall()
            return [dict(zip(("name", "model", "day", *USAGE_FIELDS), r, strict=True)) for r in rows]

        return await self._run(run)

    async def close(self) -> None:
        """Idempotent (a second close, as a test's fixture and a Tenancy both make, does nothing)."""
        if self._closed:
            return
        self._closed = True
        if self._queued:
            self._flush_writes()  # before the connection closes under them
        if self._worker_writes:
            await asyncio.gather(*self._worker_writes, return_exceptions=True)
        if self._loop_db is not None:
            self._loop_db.close()
            self._loop_db = None

        def run() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None

        await self._run(run)
        self._executor.shutdown(wait=False)
