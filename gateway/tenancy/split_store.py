"""Keys in one store, hot counters in another: with `database_url` and `tenancy.redis_url` both set,
keys, key policies, "keys are on" and the usage ledger live in PostgreSQL (durable, shared, what
`enginegate keys` and `enginegate usage` read) and the limit counters and concurrency leases in
Redis (one round trip per decision).

A settlement goes to both: Redis releases its lease and corrects its windows and budget (its own
usage copy is not read), then PostgreSQL records its usage (limits stripped: PostgreSQL holds no
counters here). Each store applies a request id once, so when the second write fails the whole
settlement is replayed later without charging the first twice."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from gateway.tenancy.keys import KeyRecord
from gateway.tenancy.limits import Decision, Limits
from gateway.tenancy.store import Grant, KeyStore, Settlement


class SplitKeyStore:
    def __init__(self, keys: KeyStore, counters: KeyStore) -> None:
        self.keys = keys
        self.counters = counters

    async def lookup(self, secret_hash: str) -> KeyRecord | None:
        return await self.keys.lookup(secret_hash)

    async def auth_enabled(self) -> bool:
        return await self.keys.auth_enabled()

    async def disable_auth(self) -> None:
        await self.keys.disable_auth()

    async def create(self, record: KeyRecord) -> None:
        await self.keys.create(record)

    async def get(self, name: str) -> KeyRecord | None:
        return await self.keys.get(name)

    async def list(self) -> list[KeyRecord]:
        return await self.keys.list()

    async def revoke(self, name: str, at: float) -> KeyRecord | None:
        return await self.keys.revoke(name, at)

    async def replace_secret(self, name: str, secret_hash: str) -> KeyRecord | None:
        return await self.keys.replace_secret(name, secret_hash)

    async def reserve(self, name: str, limits: Limits, cost: int, request_id: str,
                      secret_hash: str | None = None, released: Sequence[str] = ()) -> Decision:
        """The secret is not checked here (the keys are in the other store: one round trip each would be two);
        revocation reaches this process by the keys store's push (service.py's bounds)."""
        return await self.counters.reserve(name, limits, cost, request_id, released=released)

    async def grant(self, name: str, limits: Limits, requests: int, unit_cost: int,
                    secret_hash: str | None = None) -> Grant:
        """As `reserve`: the secret is not checked here."""
        return await self.counters.grant(name, limits, requests, unit_cost)

    async def renew(self, leases: list[tuple[str, str]]) -> None:
        await self.counters.renew(leases)

    async def release_leases(self, name: str) -> int:
        return await self.counters.release_leases(name)

    async def settle(self, settlements: list[Settlement]) -> None:
        limited = [s for s in settlements if s.limits is not None or s.release]
        if limited:
            await self.counters.settle(limited)
        await self.keys.settle([replace(s, limits=None, release=False) for s in settlements])

    async def usage(self, name: str | None = None, since: str | None = None) -> list[dict[str, Any]]:
        return await self.keys.usage(name, since)

    async def watch(self, changed: Callable[[bool], None]) -> None:
        await self.keys.watch(changed)  # the keys live there

    async def close(self) -> None:
        try:
            await self.counters.close()
        finally:
            await self.keys.close()
