"""The key store contract: keys, the atomic limit decision, and usage. Implementations: embedded
SQLite (one host; several processes on one file), Redis (several hosts or pods) and PostgreSQL
(`database_url`: every gateway that names it), all passing one table of tests.

Every method may raise `StoreUnavailable`; nothing else leaves a store for a store fault (a
server's error reply, such as Redis READONLY or OOM, is a StoreUnavailable too).

Accounting is idempotent: every `reserve` and `settle` carries the request's id, and the store
applies each at most once (a call replayed after a timeout, which the store may already have run,
changes nothing). A concurrency slot is a lease held under the request's id: `renew` extends it
(the gateway heartbeats every `LEASE_RENEW_S`), a lease not renewed for `LEASE_TTL_MS` expires,
so a dead gateway's slots come back within a minute; `release_leases` is the admin reset.

Key changes are pushed: `watch` tells this process when a key was revoked or rotated anywhere, so
the service may cache lookups (service.py states the bounds), and tells it when the push channel
is lost, so it caches nothing while it could miss a change."""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from gateway.tenancy.keys import KeyRecord
from gateway.tenancy.limits import Decision, Limits


class StoreUnavailable(Exception):
    """The store cannot be reached or used now (connection refused, timeout, locked, unwritable)."""


class KeyExists(Exception):
    pass


class KeysActive(Exception):
    """`disable_auth` refused: an unrevoked key is still in the store (revoke every key first)."""


LEASE_TTL_MS = 30_000
"""A concurrency lease not renewed for this long is gone (its gateway died)."""
LEASE_RENEW_S = 10.0
"""How often a gateway renews the leases of its requests in flight."""
WATCH_PING_S = 1.0
"""How often a key watch proves its push channel alive (a ping, or a poll of the SQLite file)."""
WATCH_DEAD_S = 3.0
"""A push channel silent this long (no answer to its pings) counts as lost."""
APPLIED_KEEP_MS = 86_400_000
"""How long a store remembers that it applied a request id (reserve or settle)."""


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
    """What one request's end changes: its concurrency lease released, the tokens the admission
    charge did not match (the prompt's correction, the completion; negative: a refund of the
    reserved completion not used) into the window and the budget, and the usage record.
    Applied at most once per `request_id`."""

    request_id: str
    name: str
    limits: Limits | None
    token_delta: int
    release: bool
    usage: UsageDelta

    def to_json(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "name": self.name, "limits": asdict(self.limits) if self.limits else None,
                "token_delta": self.token_delta, "release": self.release, "usage": self.usage.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Settlement:
        limits = Limits(**data["limits"]) if data.get("limits") else None
        request_id = str(data.get("request_id") or f"spool-{uuid.uuid4().hex}")  # a spool from before ids: applied once
        return cls(request_id, data["name"], limits, int(data["token_delta"]), bool(data["release"]), UsageDelta(**data["usage"]))


@dataclass(frozen=True, slots=True)
class Grant:
    granted: int
    """How many of the requests asked for were charged (0 to all of them)."""
    decision: Decision
    """The last one charged (its counters include the whole grant), else the refusal that stopped it."""


class KeyStore(Protocol):
    async def lookup(self, secret_hash: str) -> KeyRecord | None:
        """The active or revoked record holding this secret hash (revoked ones keep no hash: None)."""
        ...

    async def auth_enabled(self) -> bool:
        """Keys are on: recorded when the first key is created, and never turned off by revoking
        keys (a store whose every key is revoked still requires one)."""
        ...

    async def disable_auth(self) -> None:
        """The explicit admin act that turns "keys are on" off again (every key must be revoked
        first: raises KeysActive otherwise). Creating a key turns it on again."""
        ...

    async def create(self, record: KeyRecord) -> None:
        """Raises KeyExists when an unrevoked key has the name."""
        ...

    async def get(self, name: str) -> KeyRecord | None: ...

    async def list(self) -> list[KeyRecord]: ...

    async def revoke(self, name: str, at: float) -> KeyRecord | None: ...

    async def replace_secret(self, name: str, secret_hash: str) -> KeyRecord | None: ...

    async def reserve(self, name: str, limits: Limits, cost: int, request_id: str,
                      secret_hash: str | None = None, released: Sequence[str] = ()) -> Decision:
        """Check the limits and, when they allow it, charge one request, `cost` tokens and (when
        limits.concurrency is set) a lease under `request_id`: one atomic step across every process
        sharing the store. A replay of an id already reserved charges nothing again and answers
        an admitted decision. With `secret_hash` (the secret the request was authenticated with), the
        same step first checks that `name` is still an active key with that secret: refused
        `revoked`, charging nothing, when it is not (so a cached lookup can never admit a revoked key
        that has limits). `released`: request ids of `name` that have ended, whose settle (which releases
        their lease) this process has queued but not yet written: their leases end first, in the same
        step, so a client's next request never waits for its last one's settle (the settle's own release
        then finds nothing left to end)."""
        ...

    async def grant(self, name: str, limits: Limits, requests: int, unit_cost: int,
                    secret_hash: str | None = None) -> Grant:
        """An allotment (service.py): `requests` reserves of `unit_cost` tokens each, decided in one step and in
        order exactly as that many `reserve` calls would be (never beyond a limit), stopping at the first refused.
        No concurrency lease is taken (`limits.concurrency` is not checked), and no id is remembered: a grant is
        never replayed (the service does not retry one). `secret_hash` as in `reserve`: a key no longer active
        under it is granted nothing, refused `revoked`."""
        ...

    async def renew(self, leases: list[tuple[str, str]]) -> None:
        """Extend the leases (name, request_id) of requests still in flight by LEASE_TTL_MS."""
        ...

    async def settle(self, settlements: list[Settlement]) -> None:
        """Apply each settlement once (by request_id); a release ends that request's lease."""
        ...

    async def release_leases(self, name: str) -> int:
        """Admin reset: end every concurrency lease of this tenant; how many there were."""
        ...

    async def usage(self, name: str | None = None, since: str | None = None) -> list[dict[str, Any]]:
        """Rows per key, model and UTC day (since: YYYY-MM-DD, inclusive)."""
        ...

    async def watch(self, changed: Callable[[bool], None]) -> None:
        """Push key changes until cancelled. `changed(True)`: the channel is live (called once it is, again
        after every reconnect) or a key was revoked or rotated by any process; `changed(False)`: the channel
        is lost, or may be (no answer to a ping within WATCH_DEAD_S). A lookup cache drops everything at every
        call and fills only between a `changed(True)` and the next `changed(False)`. Reconnects by itself and
        never raises for a store fault."""
        ...

    async def close(self) -> None: ...
