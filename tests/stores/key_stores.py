"""Every KeyStore implementation the contract table (tests/unit/tenancy/test_store_contract.py) runs
against, and the pieces its tests and a store's own tests share.

A maker is a function of (request, tmp_path) answering `make(lease_ttl_ms)` -> a new client on one
shared, empty data set (several gateway processes on one store). A server store takes its server
from a fixture (`redis`, `postgres_url`) the requesting test module makes visible."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.database import Database
from gateway.tenancy.keys import KeyPolicy
from gateway.tenancy.limits import Limits
from gateway.tenancy.postgres_store import PostgresKeyStore
from gateway.tenancy.redis_store import RedisKeyStore
from gateway.tenancy.sqlite_store import SQLiteKeyStore
from gateway.tenancy.store import KeyStore, Settlement, UsageDelta

NOW = 1_796_165_000.0  # 2026-12-01
SHORT_TTL_MS = 400  # the lease tests' expiry (LEASE_TTL_MS is 30 s in production)
DATABASE_TIMEOUT_S = 5.0
Maker = Callable[[int], Any]


def sqlite_store(request: pytest.FixtureRequest, tmp_path: Path) -> Maker:
    path = tmp_path / "keys.sqlite3"
    return lambda ttl: SQLiteKeyStore(path, lease_ttl_ms=ttl)


def redis_store(request: pytest.FixtureRequest, tmp_path: Path) -> Maker:
    server = request.getfixturevalue("redis")
    prefix = f"t{uuid.uuid4().hex}:"
    return lambda ttl: RedisKeyStore(server.url, prefix, lease_ttl_ms=ttl)


def postgres_store(request: pytest.FixtureRequest, tmp_path: Path) -> Maker:
    """Clients of one fresh database, each with its own pool (a gateway process each)."""
    url: str = request.getfixturevalue("postgres_url")
    return lambda ttl: PostgresKeyStore(Database(url, DATABASE_TIMEOUT_S), lease_ttl_ms=ttl, owns_database=True)


STORES: dict[str, Callable[[pytest.FixtureRequest, Path], Maker]] = {
    "sqlite": sqlite_store,
    "redis": redis_store,
    "postgres": postgres_store,
}


class Clients:
    """Store clients on one data set, as several gateway processes have; closed at the test's end."""

    def __init__(self, maker: Maker) -> None:
        self.maker = maker
        self.made: list[Any] = []

    def __call__(self, lease_ttl_ms: int = 30_000) -> KeyStore:
        store = self.maker(lease_ttl_ms)
        self.made.append(store)
        return store  # type: ignore[no-any-return]

    async def close(self) -> None:
        for store in self.made:
            await store.close()


def limits(**fields: Any) -> Limits:
    return Limits.of(KeyPolicy(**fields), NOW)


def settlement(request_id: str, name: str, lim: Limits | None, delta: int = 0, release: bool = True) -> Settlement:
    return Settlement(request_id, name, lim, delta, release,
                      UsageDelta(name, "m", "2026-12-01", requests=1, prompt_tokens=4, completion_tokens=delta))
