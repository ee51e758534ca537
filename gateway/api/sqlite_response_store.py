"""The embedded stored-Responses store: one SQLite file.

Privacy: stored conversations are the users' own words, so the file (and SQLite's -wal and -shm
beside it, which take the file's mode) is created 0600 and a folder the store creates 0700; the
default folder is the gateway's own and is tightened to 0700 when it exists.

Ownership: every row has an `owner` column (the tenant). The schema is versioned with SQLite's
`PRAGMA user_version`: a file written before owners were recorded (version 0) is migrated in place
on first use, its rows keeping owner NULL (admins only); a file of a newer version is refused.

Concurrency: every SQLite call runs in a worker thread on its own short-lived connection (WAL,
busy timeout), never on the event loop; SQLite's own locking makes concurrent tasks, and several
gateway processes on one file, safe (the migration runs in one `BEGIN IMMEDIATE` transaction, so
two gateways upgrading one file at once migrate it once).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from gateway.api.response_store import IdTaken, StoredResponse, StoreUnavailable
from gateway.sqlite_wal import switch_to_wal

BUSY_TIMEOUT_S = 30.0
SCHEMA_VERSION = 1
"""1: the `owner` column. 0 (no user_version): the first schema, without owners."""
CREATE_V0 = """
CREATE TABLE responses (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    response BLOB NOT NULL,
    input_items BLOB NOT NULL,
    history BLOB NOT NULL
);
CREATE INDEX responses_created_at ON responses (created_at);
"""
"""The first schema, as gateways before owners wrote it (kept for the migration's tests)."""
MIGRATE_TO_V1 = (
    "ALTER TABLE responses ADD COLUMN owner TEXT",  # NULL on every earlier row: admins only
    "CREATE INDEX IF NOT EXISTS responses_owner ON responses (owner, created_at)",
)
PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700
COLUMNS = "id, owner, created_at, response, input_items, history"


def _private_file(path: Path) -> None:
    """Create `path` 0600 (before SQLite opens it, so it is never readable by others), or tighten it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, PRIVATE_FILE)
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, PRIVATE_FILE)
    finally:
        os.close(fd)
    for suffix in ("-wal", "-shm"):  # left by an older gateway with a wider mode
        side = path.with_name(path.name + suffix)
        if side.exists() and side.stat().st_mode & 0o077:
            side.chmod(PRIVATE_FILE)


def migrate(conn: sqlite3.Connection) -> None:
    """Bring the file to SCHEMA_VERSION in one write transaction (a second gateway waits, then finds it done)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreUnavailable(f"it was written by a newer enginegate (schema version {version}; this one "
                                   f"reads {SCHEMA_VERSION})")
        if version == 0:
            exists = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'responses'").fetchone()
            if not exists:
                for statement in CREATE_V0.split(";"):
                    if statement.strip():
                        conn.execute(statement)
            for statement in MIGRATE_TO_V1:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except BaseException:
        conn.rollback()
        raise
    conn.commit()


class SQLiteResponseStore:
    """The embedded store; the file and its folder are made (or migrated) on first use, or by `check()`."""

    def __init__(self, path: Path, max_age_s: float, max_count: int, own_folder: bool = False) -> None:
        self.path = path
        self.max_age_s = max_age_s
        self.max_count = max_count
        """Per owner: one tenant's writes never evict another's records."""
        self.own_folder = own_folder
        """The folder is the gateway's alone (the default path): tightened to 0700 even when it exists."""
        self._ready = False
        self._init_lock = threading.Lock()

    def describe(self) -> str:
        return f"{self.path} (SQLite, 0600)"

    async def check(self) -> None:
        await asyncio.to_thread(lambda: self._connect().close())

    def _connect(self) -> sqlite3.Connection:
        try:
            return sqlite3.connect(self.path if self._ready else self._prepare(), timeout=BUSY_TIMEOUT_S,
                                   isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise self._unavailable(exc) from exc
        except StoreUnavailable as exc:
            raise StoreUnavailable(f"the response store {self.path} cannot be used: {exc}") from exc

    def _unavailable(self, exc: BaseException) -> StoreUnavailable:
        return StoreUnavailable(f"the response store {self.path} cannot be used ({type(exc).__name__}: {exc}); "
                                "set response_store.path to a file in a writable folder")

    def _prepare(self) -> Path:
        """Make the folder (0700), the file (0600), WAL mode and the schema once. Under a lock: two threads
        switching the journal mode at once can get SQLITE_BUSY without the busy timeout ("database is locked")."""
        with self._init_lock:
            if not self._ready:
                folder = self.path.parent
                if not folder.is_dir():
                    folder.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
                    folder.chmod(PRIVATE_DIR)  # mkdir's mode is filtered by the umask; parents keep theirs
                elif self.own_folder and folder.stat().st_mode & 0o077:
                    folder.chmod(PRIVATE_DIR)
                _private_file(self.path)
                conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
                try:
                    switch_to_wal(conn, BUSY_TIMEOUT_S)
                    migrate(conn)
                finally:
                    conn.close()
                self._ready = True
        return self.path

    def _run(self, work: Any, *args: Any) -> Any:
        try:
            return work(*args)
        except sqlite3.Error as exc:
            raise self._unavailable(exc) from exc

    def _put(self, record: StoredResponse) -> None:
        conn = self._connect()
        try:
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                written = conn.execute(
                    f"INSERT INTO responses ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
                    "created_at = excluded.created_at, response = excluded.response, "
                    "input_items = excluded.input_items, history = excluded.history "
                    "WHERE responses.owner IS excluded.owner",
                    (record.id, record.owner, record.created_at, orjson.dumps(record.response),
                     orjson.dumps(record.input_items), orjson.dumps(record.history)),
                ).rowcount
                if not written:
                    raise IdTaken(record.id)
                conn.execute("DELETE FROM responses WHERE created_at < ?", (time.time() - self.max_age_s,))
                conn.execute(
                    "DELETE FROM responses WHERE id IN (SELECT id FROM responses WHERE owner IS ? "
                    "ORDER BY created_at DESC, rowid DESC LIMIT -1 OFFSET ?)",
                    (record.owner, self.max_count),
                )
        finally:
            conn.close()

    @staticmethod
    def _where(owner: str | None) -> tuple[str, tuple[Any, ...]]:
        """The rows `owner` reaches: its own; every row for None. A NULL owner (before owners) matches no name."""
        return ("", ()) if owner is None else (" AND owner = ?", (owner,))

    def _get(self, response_id: str, owner: str | None) -> StoredResponse | None:
        scope, args = self._where(owner)
        conn = self._connect()
        try:
            row = conn.execute(
                f"SELECT {COLUMNS} FROM responses WHERE id = ? AND created_at >= ?{scope}",
                (response_id, time.time() - self.max_age_s, *args),
            ).fetchone()
        finally:
            conn.close()
        if row is None:
            return None
        return StoredResponse(row[0], row[1], row[2], orjson.loads(row[3]), orjson.loads(row[4]), orjson.loads(row[5]))

    def _delete(self, response_id: str, owner: str | None) -> bool:
        scope, args = self._where(owner)
        conn = self._connect()
        try:
            with conn:
                return conn.execute(f"DELETE FROM responses WHERE id = ? AND created_at >= ?{scope}",
                                    (response_id, time.time() - self.max_age_s, *args)).rowcount > 0
        finally:
            conn.close()

    async def put(self, record: StoredResponse) -> None:
        await asyncio.to_thread(self._run, self._put, record)

    async def get(self, response_id: str, owner: str | None) -> StoredResponse | None:
        return await asyncio.to_thread(self._run, self._get, response_id, owner)  # type: ignore[no-any-return]

    async def delete(self, response_id: str, owner: str | None) -> bool:
        return await asyncio.to_thread(self._run, self._delete, response_id, owner)  # type: ignore[no-any-return]

    async def close(self) -> None:
        return None
