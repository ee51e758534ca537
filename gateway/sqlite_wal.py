"""What both embedded SQLite stores (keys, stored Responses) need of SQLite's locking."""

from __future__ import annotations

import sqlite3
import time


def is_locked(exc: sqlite3.OperationalError) -> bool:
    """SQLITE_BUSY/LOCKED: another connection holds the lock."""
    return "locked" in str(exc) or "busy" in str(exc)


def switch_to_wal(conn: sqlite3.Connection, busy_timeout_s: float) -> None:
    """Switch to WAL, waiting out another process doing the same: SQLite answers that change with SQLITE_BUSY
    at once, without its busy handler, while another connection opens the new file (two gateways, or two
    store clients, starting together), so the busy timeout is applied here by hand (never on the event loop)."""
    deadline = time.monotonic() + busy_timeout_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if not is_locked(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
