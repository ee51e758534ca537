"""The memory budget's decisions, as pure functions: what to evict before a load, and what can never fit.

A pool is one place memory is counted: `ram` (system RAM), `unified` (Apple unified memory) or
`gpu:N` (one GPU). A model charges bytes to one or more pools (a model split over two GPUs
charges each its share). Nothing here touches an engine: the lifecycle reads a `Decision` and
carries it out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

Charges = Mapping[str, int]
"""Pool name -> bytes."""


@dataclass(frozen=True, slots=True)
class Resident:
    """A model that holds memory now (loaded, or loading)."""

    name: str
    charges: Charges
    last_used: float = 0.0
    pinned: bool = False
    busy: bool = False
    """Requests running or queued on it, or still loading: it cannot be evicted now."""
    protected: bool = False
    """Just swapped in and still serving the requests that waited for it (the anti-thrash rule)."""

    @property
    def evictable(self) -> bool:
        return not (self.pinned or self.busy or self.protected)


@dataclass(frozen=True, slots=True)
class Fit:
    """The load can go ahead once `evict` (least recently used first) are unloaded."""

    evict: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Wait:
    """Memory is held by busy or just-swapped-in models that will free it: wait, then decide again.

    `drain`: busy models to stop admitting new requests, so their memory frees once their running
    requests end (the fairness bound has passed for them)."""

    reason: str
    drain: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Refuse:
    """It cannot fit now and waiting would not help (pinned models hold the memory)."""

    reason: str


Decision = Fit | Wait | Refuse


@dataclass(frozen=True, slots=True)
class Shortfall:
    pool: str
    need: int
    capacity: int
    held: dict[str, int] = field(default_factory=dict)


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _used(residents: Iterable[Resident], pool: str) -> int:
    return sum(r.charges.get(pool, 0) for r in residents)


def _over(need: Charges, capacity: Charges, residents: list[Resident]) -> list[str]:
    return [p for p, n in need.items() if n and p in capacity and _used(residents, p) + n > capacity[p]]


def decide(name: str, need: Charges, capacity: Charges, residents: Iterable[Resident]) -> Decision:
    """What loading `name` (charging `need`) takes, given what is resident.

    Evicts idle unpinned models, least recently used first, only those that hold memory in a
    pool that is short, until every pool fits. When the idle ones are not enough: Wait if busy or
    protected models hold the rest (they will free it), Refuse if only pinned ones do. A pool not
    in `capacity` is not budgeted."""
    others = [r for r in residents if r.name != name]
    short = _over(need, capacity, others)
    if not short:
        return Fit()
    evict: list[str] = []
    left = list(others)
    for r in sorted((r for r in others if r.evictable), key=lambda r: (r.last_used, -sum(r.charges.values()))):
        if not any(r.charges.get(p, 0) for p in short):
            continue
        evict.append(r.name)
        left.remove(r)
        short = _over(need, capacity, left)
        if not short:
            return Fit(tuple(evict))
    pool = short[0]
    holders = [r for r in left if r.charges.get(pool, 0)]
    figures = (f"{name} needs {gib(need[pool])} of {pool} ({gib(capacity[pool])} budget); "
               + ", ".join(f"{r.name} holds {gib(r.charges[pool])}" + _why(r) for r in holders))
    waiting_on = [r for r in holders if (r.busy or r.protected) and not r.pinned]
    if waiting_on and need[pool] <= capacity[pool] - sum(r.charges[pool] for r in holders if r.pinned):
        drain = tuple(r.name for r in waiting_on if r.busy and not r.protected)
        return Wait(f"waiting for busy models to free memory: {figures}", drain)
    return Refuse(f"pinned models hold the memory: {figures}" if any(r.pinned for r in holders)
                  else f"not enough memory: {figures}")


def _why(r: Resident) -> str:
    tags = [t for t, on in (("pinned", r.pinned), ("busy", r.busy), ("just loaded", r.protected)) if on]
    return f" ({', '.join(tags)})" if tags else ""


def never_fits(need: Charges, capacity: Charges) -> str | None:
    """Why a model cannot fit even alone in an empty budget, or None."""
    for pool, n in need.items():
        if pool in capacity and n > capacity[pool]:
            return f"needs {gib(n)} of {pool} but the budget is {gib(capacity[pool])} ({n} > {capacity[pool]} bytes)"
    return None


def pinned_overflow(pinned: Mapping[str, Charges], capacity: Charges) -> str | None:
    """Why the pinned models together cannot all be resident, or None."""
    for pool, cap in capacity.items():
        held = {name: c.get(pool, 0) for name, c in pinned.items() if c.get(pool, 0)}
        if sum(held.values()) > cap:
            parts = ", ".join(f"{n} {gib(b)}" for n, b in held.items())
            return f"pinned models need {gib(sum(held.values()))} of {pool} together ({parts}) but the budget is {gib(cap)}"
    return None


def differs(estimate: int, measured: int, tolerance: float = 0.2) -> bool:
    """Estimate and measurement differ by more than `tolerance` of the measurement."""
    return measured > 0 and abs(estimate - measured) > tolerance * measured
