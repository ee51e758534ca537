"""The embedded stored-Responses store: one SQLite file.

Privacy: stored conversations are the users' own words, so the file (and SQLite's -wal and -shm
beside it, which take the file's mode) is created 0600 and a folder the store creates 0700; the
default folder is the gateway's own and is tightened to 0700 when it exists.

Concurrency: every SQLite call runs in a worker thread on its own short-lived connection (WAL,
busy timeout), never on the event loop; SQLite's own locking makes concurrent tasks, and several
gateway processes on one file, safe.
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

from gateway.api.response_store import StoredResponse, StoreUnavailable

BUSY_TIMEOUT_S = 30.0
SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    response BLOB NOT NULL,
    input_items BLOB NOT NULL,
    history BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_created_at ON responses (created_at);
"""
PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700


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


class SQLiteResponseStore:
    """The embedded store; the file and its folder are made on first use (or by `check()`)."""

    def __init__(self, path: Path, max_age_s: float, max_count: int, own_folder: bool = False) -> None:
        self.path = path
        self.max_age_s = max_age_s
        self.max_count = max_count
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
                    conn.execute("PRAGMA journal_mode=WAL")
                    conn.executescript(SCHEMA)
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
                conn.execute(
                    "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?)",
                    (record.id, record.created_at, orjson.dumps(record.response), orjson.dumps(record.input_items),
                     orjson.dumps(record.history)),
                )
                conn.execute("DELETE FROM responses WHERE created_at < ?", (time.time() - self.max_age_s,))
                conn.execute(
                    "DELETE FROM responses WHERE id IN (SELECT id FROM responses ORDER BY created_at DESC LIMIT -1 OFFSET ?)",
                    (self.max_count,),
                )
        finally:
            conn.close()

    def _get(self, response_id: str) -> StoredResponse | None:
        conn = self._connect()
        try:
            row = conn.execute(
                "SELECT id, created_at, response, input_items, history FROM responses WHERE id = ? AND created_at >= ?",
                (response_id, time.time() - self.max_age_s),
            ).fetchone()
        finally:
            conn.close()
        if row is None:
            return None
        return StoredResponse(row[0], None, row[1], orjson.loads(row[2]), orjson.loads(row[3]), orjson.loads(row[4]))

    def _delete(self, response_id: str) -> bool:
        conn = self._connect()
        try:
            with conn:
                return conn.execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount > 0
        finally:
            conn.close()

    async def put(self, record: StoredResponse) -> None:
        await asyncio.to_thread(self._run, self._put, record)

    async def get(self, response_id: str, owner: str | None) -> StoredResponse | None:
        return await asyncio.to_thread(self._run, self._get, response_id)  # type: ignore[no-any-return]

    async def delete(self, response_id: str, owner: str | None) -> bool:
        return await asyncio.to_thread(self._run, self._delete, response_id)  # type: ignore[no-any-return]

    async def close(self) -> None:
        return None
