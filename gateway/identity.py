"""Who sent a request: the seam between authentication (tenancy) and everything that treats
clients differently (admin routes, limits, the scheduler's flows).

The auth middleware puts one `Caller` into the ASGI scope (`scope["state"]["caller"]`) before the
app runs; everything downstream reads it with `caller_of(scope)` and never looks at keys itself.
With no keys configured there is no caller: `caller_of` answers None and every route is open."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Role = Literal["admin", "user"]
ServiceTier = Literal["priority", "default", "flex"]
CALLER_STATE = "caller"


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated key's identity (never its secret)."""

    name: str
    """The tenant: a key's name, stable across rotations; the scheduler's flow and the usage records' key."""
    role: Role = "user"
    weight: float = 1.0
    """The tenant's share in fair scheduling, relative to other tenants' weights."""
    service_tier: ServiceTier | None = None
    """The highest priority class this tenant's requests may use and their class when a request names none
    (None: `default`); gateway/scheduling/classify.py applies it."""

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


def caller_of(scope: Mapping[str, Any]) -> Caller | None:
    """The request's authenticated caller; None when the gateway runs without keys."""
    state = scope.get("state")
    caller = state.get(CALLER_STATE) if isinstance(state, Mapping) else None
    return caller if isinstance(caller, Caller) else None


def set_caller(scope: dict[str, Any], caller: Caller) -> None:
    scope.setdefault("state", {})[CALLER_STATE] = caller
