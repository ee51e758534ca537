"""Settlements merged before a write: the settles of one key, model and day that a write round holds become one,
so a store applies one usage row update and one token correction for a burst, not one per request.

A merged settlement has an id of its own and is applied once by it, like any other; the service merges only
settlements never sent (one already tried, which the store may have applied, keeps its id: merged again under a
new id it could be applied twice). A settlement that ends a lease is never merged: the store ends the lease by
its id. Token corrections add up in any order; only at a clamp (a window or budget refunded below 0) does the
sum differ from the steps, and then by no more than the clamp would have hidden."""

from __future__ import annotations

import uuid
from dataclasses import replace

from gateway.tenancy.limits import Limits
from gateway.tenancy.store import USAGE_FIELDS, Settlement, UsageDelta

_Group = tuple[str, str, str, tuple[object, ...] | None]


def _limits_key(limits: Limits | None) -> tuple[object, ...] | None:
    if limits is None:
        return None
    return (limits.rpm, limits.tpm, limits.concurrency, limits.budget, limits.window_ms, limits.budget_period)


def merged(settlements: list[Settlement]) -> list[Settlement]:
    """The same effect in fewer settlements, in the order of each group's first member."""
    if len(settlements) < 2:
        return settlements
    out: list[Settlement | list[Settlement]] = []
    groups: dict[_Group, list[Settlement]] = {}
    for s in settlements:
        if s.release:
            out.append(s)
            continue
        key = (s.name, s.usage.model, s.usage.day, _limits_key(s.limits))
        members = groups.get(key)
        if members is None:
            members = groups[key] = []
            out.append(members)
        members.append(s)
    return [item if isinstance(item, Settlement) else _one(item) for item in out]


def _one(members: list[Settlement]) -> Settlement:
    if len(members) == 1:
        return members[0]
    first = members[0]
    counts = {f: sum(getattr(m.usage, f) for m in members) for f in USAGE_FIELDS}
    usage = UsageDelta(first.usage.name, first.usage.model, first.usage.day, **counts)
    return replace(first, request_id=uuid.uuid4().hex, token_delta=sum(m.token_delta for m in members), usage=usage)
