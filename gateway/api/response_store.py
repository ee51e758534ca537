"""Stored Responses (`store: true`): what `previous_response_id`, GET/DELETE and input_items read.

`ResponseStore` is the whole contract, so a server database can replace the embedded SQLite one
when several gateways share state. Each record keeps the conversation's full item history (every
earlier input and output, in order), so a continuation reads one row and survives the retention
pruning of the responses before it.

Concurrency: every SQLite call runs in a worker thread on its own short-lived connection (WAL,
busy timeout), never on the event loop; SQLite's own locking makes concurrent tasks, and several
gateway processes on one file, safe.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson

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


@dataclass(frozen=True, slots=True)
class StoredResponse:
    id: str
    created_at: float
    response: dict[str, Any]
    """The Response object as the client received it."""
    input_items: list[dict[str, Any]]
    """This request's input items (with ids), for GET /v1/responses/{id}/input_items."""
    history: list[dict[str, Any]]
    """Every item of the conversation up to and including this response's output."""


class ResponseStore(Protocol):
    async def put(self, record: StoredResponse) -> None: ...

    async def get(self, response_id: str) -> StoredResponse | None: ...

    async def delete(self, response_id: str) -> bool: ...


def default_store_path() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "enginegate" / "responses.sqlite3"


class SQLiteResponseStore:
    """The embedded store; the file and its folder are made on first use."""

    def __init__(self, path: Path, max_age_s: float, max_count: int) -> None:
        self.path = path
        self.max_age_s = max_age_s
        self.max_count = max_count
        self._ready = False

    def _connect(self) -> sqlite3.Connection:
        if not self._ready:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        if not self._ready:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(SCHEMA)
            self._ready = True
        return conn

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
        return StoredResponse(row[0], row[1], orjson.loads(row[2]), orjson.loads(row[3]), orjson.loads(row[4]))

    def _delete(self, response_id: str) -> bool:
        conn = self._connect()
        try:
            with conn:
                return conn.execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount > 0
        finally:
            conn.close()

    async def put(self, record: StoredResponse) -> None:
        await asyncio.to_thread(self._put, record)

    async def get(self, response_id: str) -> StoredResponse | None:
        return await asyncio.to_thread(self._get, response_id)

    async def delete(self, response_id: str) -> bool:
        return await asyncio.to_thread(self._delete, response_id)
