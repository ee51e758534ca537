"""The SQLite response store's schema versions: a file an older gateway wrote (no owners, user_version 0)
is migrated in place on first use, its rows admins only; a newer gateway's file is refused, never misread."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import orjson
import pytest

from gateway.api.response_store import ANONYMOUS, StoredResponse, StoreUnavailable
from gateway.api.sqlite_response_store import CREATE_V0, SCHEMA_VERSION, SQLiteResponseStore


def old_file(path: Path, ids: list[str]) -> None:
    """responses.sqlite3 as the gateway before owners wrote it."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(CREATE_V0)
    for rid in ids:
        conn.execute("INSERT INTO responses VALUES (?, ?, ?, ?, ?)",
                     (rid, time.time(), orjson.dumps({"id": rid}), orjson.dumps([{"id": "in_" + rid}]),
                      orjson.dumps([{"id": "in_" + rid}, {"id": "out_" + rid}])))
    conn.commit()
    conn.close()


def version(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


async def test_an_old_file_is_migrated_in_place_and_its_rows_are_admin_only(tmp_path: Path) -> None:
    path = tmp_path / "responses.sqlite3"
    old_file(path, ["resp_old1", "resp_old2"])
    assert version(path) == 0
    store = SQLiteResponseStore(path, max_age_s=3600, max_count=1)
    await store.check()
    assert version(path) == SCHEMA_VERSION == 1
    got = await store.get("resp_old1", None)  # an admin, or a gateway without keys
    assert got is not None and got.owner is None and got.history == [{"id": "in_resp_old1"}, {"id": "out_resp_old1"}]
    for tenant in ("team-a", ANONYMOUS):
        assert await store.get("resp_old1", tenant) is None
        assert await store.delete("resp_old1", tenant) is False
    await store.put(StoredResponse("resp_new", "team-a", time.time(), {"id": "resp_new"}, [], []))
    assert await store.get("resp_new", "team-a") is not None
    assert await store.get("resp_old2", None) is not None  # team-a's max_count of 1 never prunes the old rows
    again = SQLiteResponseStore(path, max_age_s=3600, max_count=1)  # the next start: nothing left to migrate
    await again.check()
    assert await again.get("resp_new", "team-a") is not None and version(path) == 1


async def test_gateways_upgrading_one_file_at_once_migrate_it_once(tmp_path: Path) -> None:
    path = tmp_path / "responses.sqlite3"
    old_file(path, ["resp_old"])
    stores = [SQLiteResponseStore(path, max_age_s=3600, max_count=10) for _ in range(4)]
    await asyncio.gather(*(s.check() for s in stores))  # a second ALTER TABLE would be "duplicate column"
    assert version(path) == 1
    got = await stores[3].get("resp_old", None)
    assert got is not None and got.owner is None


async def test_a_newer_gateways_file_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "responses.sqlite3"
    await SQLiteResponseStore(path, max_age_s=3600, max_count=10).check()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    with pytest.raises(StoreUnavailable, match=f"{path}.*newer enginegate.*schema version {SCHEMA_VERSION + 1}"):
        await SQLiteResponseStore(path, max_age_s=3600, max_count=10).check()


async def test_a_new_file_is_private_and_current(tmp_path: Path) -> None:
    path = tmp_path / "new" / "responses.sqlite3"
    await SQLiteResponseStore(path, max_age_s=3600, max_count=10).check()
    assert version(path) == 1
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
