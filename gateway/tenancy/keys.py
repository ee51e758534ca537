"""Key records: a name (the tenant), a hashed secret, a role and the key's policy (models, limits,
budget). Pure: no I/O. The secret itself exists only in the answer to create/rotate."""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
import time
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.identity import Caller, Role, ServiceTier

log = logging.getLogger("enginegate.keys")
SECRET_PREFIX = "eg-"
BudgetPeriod = Literal["day", "month"]
_warned_unknown: set[tuple[str, ...]] = set()


class UnreadableKey(ValueError):
    """A stored key record whose known fields this gateway cannot read (a value a newer gateway allows)."""


class KeyPolicy(BaseModel):
    """What a key may do: the same fields for keys made with `enginegate keys create` and keys in the config file."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    role: Role = "user"
    """admin: every route, including /admin/* and the engines' pids and ports in /ready; user: the /v1 API."""
    models: tuple[str, ...] = ()
    """Model ids (or aliases) this key may use; empty: every model. Others answer 404 and are hidden from /v1/models."""
    rpm: int | None = Field(default=None, ge=1)
    """Requests per window (window_seconds, a minute by default); over it: 429 rate_limit_exceeded."""
    tpm: int | None = Field(default=None, ge=1)
    """Tokens (prompt + completion) per window; over it: 429 rate_limit_exceeded."""
    max_concurrency: int | None = Field(default=None, ge=1)
    """Requests of this key running at once, across every gateway sharing the store."""
    budget_tokens: int | None = Field(default=None, ge=1)
    """Tokens per budget_period; spent: 429 insufficient_quota until the period ends."""
    budget_period: BudgetPeriod = "month"
    """The budget's period, in UTC: a calendar day or month."""
    window_seconds: float = Field(default=60.0, gt=0)
    """The length of the rpm/tpm window (it starts at the window's first request): 60 makes them per minute."""
    expires: date | datetime | None = None
    """After this (UTC; a date means its end), the key answers 401."""
    weight: float = Field(default=1.0, gt=0)
    """The tenant's share in fair scheduling, relative to other tenants."""
    service_tier: ServiceTier | None = None
    """The highest priority class this key's requests may use, and theirs when a request names none: a
    request may ask for a lower one (`service_tier` in the body, or the tier header), never a higher one
    (it is then served at this one, and an upstream is told this one). None: `default`, so only keys given
    `priority` may use it."""

    @property
    def limited(self) -> bool:
        return any(v is not None for v in (self.rpm, self.tpm, self.max_concurrency, self.budget_tokens))


@dataclass(frozen=True, slots=True)
class KeyRecord:
    name: str
    secret_hash: str
    policy: KeyPolicy
    created_at: float
    revoked_at: float | None = None
    static: bool = False
    """From the config file: not revocable or rotatable through the store."""
    unknown: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    """Policy fields of a newer gateway, unknown here: the key is refused by this gateway (it could be a restriction
    it cannot enforce), listed by /admin/keys, and kept when the record is rewritten."""

    def caller(self) -> Caller:
        return Caller(self.name, self.policy.role, self.policy.weight, self.policy.service_tier)

    def expired(self, now: float) -> bool:
        return self.policy.expires is not None and now >= expires_at(self.policy.expires)

    def to_json(self) -> dict[str, Any]:
        """The stored form (with the hash, never the secret)."""
        return {"name": self.name, "secret_hash": self.secret_hash, "created_at": self.created_at,
                "revoked_at": self.revoked_at,
                "policy": {**self.unknown, **self.policy.model_dump(mode="json", exclude_defaults=True)}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KeyRecord:
        """The stored form. Unlike a config-file key (extra="forbid": a typo fails start-up), a stored record may
        hold fields a newer gateway wrote: they are kept in `unknown` (a warning, once) rather than fail reading
        (the admin API still lists and revokes the key; authentication refuses it); a known field's value this
        gateway cannot read raises UnreadableKey."""
        name = data["name"]
        stored = data.get("policy") or {}
        unknown = {k: v for k, v in stored.items() if k not in KeyPolicy.model_fields}
        if unknown:
            _warn_unknown(name, tuple(sorted(unknown)))
        try:
            policy = KeyPolicy.model_validate({k: v for k, v in stored.items() if k not in unknown})
        except ValidationError as exc:
            fields = ", ".join(".".join(str(p) for p in e["loc"]) for e in exc.errors())
            raise UnreadableKey(f"the stored key {name!r} has values this enginegate cannot read ({fields}): "
                                "written by a newer gateway? Upgrade this one") from exc
        return cls(name, data["secret_hash"], policy, float(data["created_at"]), data.get("revoked_at"),
                   unknown=unknown)

    def public(self) -> dict[str, Any]:
        """What /admin/keys and `keys list` show: everything but the secret and its hash."""
        return {"name": self.name, "created_at": self.created_at, "revoked_at": self.revoked_at,
                "static": self.static, "active": self.revoked_at is None and not self.expired(time.time()),
                **self.policy.model_dump(mode="json"),
                **({"unknown_fields": sorted(self.unknown)} if self.unknown else {})}


def _warn_unknown(name: str, fields: tuple[str, ...]) -> None:
    if fields not in _warned_unknown:  # once per set of fields, not on every request of every such key
        _warned_unknown.add(fields)
        log.warning("the stored key %r has policy fields this enginegate does not know (%s): written by a newer "
                    "gateway? This one refuses the key (it cannot enforce them) until it is upgraded",
                    name, ", ".join(fields))


def expires_at(value: date | datetime) -> float:
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).timestamp()
    return datetime(value.year, value.month, value.day, tzinfo=timezone.utc).timestamp() + 86400


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def hash_secret(secret: str | bytes) -> str:
    """SHA-256 of the secret: the secrets are 256 random bits (or the operator's own config key),
    so a fast hash is enough; only the hash is stored and compared."""
    return hashlib.sha256(secret if isinstance(secret, bytes) else secret.encode()).hexdigest()


def new_record(name: str, policy: KeyPolicy, now: float | None = None) -> tuple[KeyRecord, str]:
    if not re.fullmatch(VALID_NAME, name):
        raise ValueError(f"a key name is 1-64 letters, digits, '.', '_' or '-' (got {name[:64]!r})")
    secret = new_secret()
    return KeyRecord(name, hash_secret(secret), policy, time.time() if now is None else now), secret


def rotated(record: KeyRecord) -> tuple[KeyRecord, str]:
    secret = new_secret()
    return replace(record, secret_hash=hash_secret(secret)), secret


def allows_model(policy: KeyPolicy, model_id: str, aliases: tuple[str, ...] = ()) -> bool:
    return not policy.models or model_id in policy.models or any(a in policy.models for a in aliases)


VALID_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
