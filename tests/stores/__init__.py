"""Every ResponseStore implementation the contract tests (tests/unit/stores) run against.

A factory opens a store whose records live at `place`, a folder of the test's own: two stores
opened at one place see the same records (a restarted gateway, or a second gateway sharing them).
A new implementation is one line in RESPONSE_STORES. A server store takes its server from
`servers` (the contract fixture starts only the servers its parameter needs)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Protocol

from gateway.api.postgres_response_store import PostgresResponseStore
from gateway.api.response_store import ResponseStore
from gateway.api.sqlite_response_store import SQLiteResponseStore
from gateway.database import Database


class ResponseStoreFactory(Protocol):
    def __call__(self, place: Path, servers: dict[str, Any], *, max_age_s: float, max_count: int) -> ResponseStore: ...


def make_sqlite(place: Path, servers: dict[str, Any], *, max_age_s: float, max_count: int) -> ResponseStore:
    return SQLiteResponseStore(place / "responses.sqlite3", max_age_s, max_count)


_made: set[tuple[int, str]] = set()


class _GatewayPostgresStore(PostgresResponseStore):
    """A store with its own pool, closed with it (in a gateway the pool is shared and closed at shutdown)."""

    async def close(self) -> None:
        await super().close()
        await self.db.close()


def make_postgres(place: Path, servers: dict[str, Any], *, max_age_s: float, max_count: int) -> ResponseStore:
    server = servers["postgres"]
    name = "rs_" + hashlib.sha1(str(place).encode()).hexdigest()[:16]  # one database per place
    if (server.port, name) not in _made:
        server.createdb(name)
        _made.add((server.port, name))
    return _GatewayPostgresStore(Database(server.url(name), 5.0), max_age_s, max_count)


RESPONSE_STORES: dict[str, ResponseStoreFactory] = {"sqlite": make_sqlite, "postgres": make_postgres}
SERVERS_NEEDED: dict[str, tuple[str, ...]] = {"postgres": ("postgres",)}
