"""The key store contract: keys, the atomic limit decision, and usage. Two implementations:
embedded SQLite (one host; several processes on one file) and Redis (several hosts or pods).

Every method may raise `StoreUnavailable`; nothing else leaves a store for a store fault."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol

from gateway.tenancy.keys import KeyRecord
from gateway.tenancy.limits import Decision, Limits


class StoreUnavailable(Exception):
    """The store cannot be reached or used now (connection refused, timeout, locked, unwritable)."""


class KeyExists(Exception):
    pass


@dataclass(frozen=True, slots=True)
class UsageDelta:
    name: str
    model: str
    day: str
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    errors: int = 0
    rejected: int = 0
    engine_ms: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


USAGE_FIELDS = ("requests", "prompt_tokens", "completion_tokens", "errors", "rejected", "engine_ms")


@dataclass(frozen=True, slots=True)
class Settlement:
    """What one request's end changes: its concurrency slot back, the tokens the admission charge
    did not cover (the completion, and the prompt's correction) into the window and the budget,
    and the usage record."""

    name: str
    limits: Limits | None
    token_delta: int
    release: bool
    usage: UsageDelta

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "limits": asdict(self.limits) if self.limits else None,
                "token_delta": self.token_delta, "release": self.release, "usage": self.usage.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Settlement:
        limits = Limits(**data["limits"]) if data.get("limits") else None
        return cls(data["name"], limits, int(data["token_delta"]), bool(data["release"]), UsageDelta(**data["usage"]))


class KeyStore(Protocol):
    async def lookup(self, secret_hash: str) -> KeyRecord | None:
        """The active or revoked record holding this secret hash (revoked ones keep no hash: None)."""
        ...

    async def has_keys(self) -> bool: ...

    async def create(self, record: KeyRecord) -> None:
        """Raises KeyExists when an unrevoked key has the name."""
        ...

    async def get(self, name: str) -> KeyRecord | None: ...

    async def list(self) -> list[KeyRecord]: ...

    async def revoke(self, name: str, at: float) -> KeyRecord | None: ...

    async def replace_secret(self, name: str, secret_hash: str) -> KeyRecord | None: ...

    async def reserve(self, name: str, limits: Limits, cost: int) -> Decision:
        """Check the limits and, when they allow it, charge one request, `cost` tokens and one
        concurrency slot: one atomic step across every process sharing the store."""
        ...

    async def settle(self, settlements: list[Settlement]) -> None: ...

    async def usage(self, name: str | None = None, since: str | None = None) -> list[dict[str, Any]]:
        """Rows per key, model and UTC day (since: YYYY-MM-DD, inclusive)."""
        ...

    async def close(self) -> None: ...
