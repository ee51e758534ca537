"""Local allotments, the pure part: how much of a key's limits one gateway takes from the store ahead of need,
and how a request is admitted from it. Side effects (the grant call, returning what is left) are service.py's.

A busy key's requests are admitted here, from capacity the store has already charged to this gateway: a grant
is that many reserves of the key's usual reservation, decided in the store in one step (store.py, `grant`), so
the sum of every gateway's admissions never passes a limit. What a gateway does not use before its allotment
ends is a refusal at the edge for the others, never an excess; the sizing keeps that small:

- only a key with at least MIN_GRANT requests here in the last DEMAND_WINDOW_S gets one, sized to twice what it
  used in that time (at most MAX_GRANT requests), and a refill is asked for when half of it is used or it has
  less than REFILL_AHEAD_S to live, so a busy key's requests rarely find it empty;
- never more than 1/SHARE of what is left of rpm or tpm, nor 1/BUDGET_SHARE of a budget's (a gateway killed
  with an allotment takes its unused budget with it: nothing gives it back), so near the edge grants shrink to
  nothing and every request goes to the store again, exactly as without allotments;
- an allotment ends after TTL_S, and always before its window resets (the store's window it was charged to).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.tenancy.limits import Counters, Decision, Limits

MIN_GRANT = 2
MAX_GRANT = 128
SHARE = 8
BUDGET_SHARE = 64
DEMAND_WINDOW_S = 0.1
TTL_S = 1.0
REFILL_AHEAD_S = 0.2
WINDOW_MARGIN_S = 0.05
"""An allotment ends this long before the store's window it was charged to resets."""


def same_limits(a: Limits, b: Limits) -> bool:
    """The policy part of two Limits (budget_reset_ms changes at every call)."""
    return (a.rpm, a.tpm, a.concurrency, a.budget, a.window_ms, a.budget_period) == (
        b.rpm, b.tpm, b.concurrency, b.budget, b.window_ms, b.budget_period)


@dataclass(slots=True)
class Demand:
    """A key's requests here in the current and the last DEMAND_WINDOW_S, and its usual reservation."""

    started: float = 0.0
    current: int = 0
    last: int = 0
    unit_cost: float = 0.0

    def seen(self, now: float, cost: int) -> None:
        if now - self.started >= DEMAND_WINDOW_S:
            self.last = self.current if now - self.started < 2 * DEMAND_WINDOW_S else 0
            self.started, self.current = now, 0
        self.current += 1
        self.unit_cost = cost if self.unit_cost == 0 else max(cost, 0.8 * self.unit_cost + 0.2 * cost)

    @property
    def recent(self) -> int:
        return max(self.current, self.last)


def grant_size(demand: Demand, limits: Limits, counters: Counters | None) -> tuple[int, int]:
    """(requests, tokens per request) to ask for, (0, 0) for none. `counters`: the key's last decision seen
    here (None: none yet, so no grant before the store has answered once)."""
    if counters is None or demand.recent < MIN_GRANT:
        return 0, 0
    unit = math.ceil(demand.unit_cost) if (limits.tpm or limits.budget) else 0
    n = min(MAX_GRANT, 2 * demand.recent)
    if limits.rpm:
        n = min(n, (limits.rpm - counters.requests) // SHARE)
    if unit:
        if limits.tpm:
            n = min(n, (limits.tpm - counters.tokens) // SHARE // unit)
        if limits.budget:
            n = min(n, (limits.budget - counters.budget_used) // BUDGET_SHARE // unit)
    return (n, unit) if n >= MIN_GRANT else (0, 0)


def lifetime_s(limits: Limits, counters: Counters) -> float:
    """How long an allotment charged with these counters may be used: TTL_S, and not past its windows."""
    life = TTL_S
    if limits.rpm:
        life = min(life, counters.requests_reset_ms / 1000 - WINDOW_MARGIN_S)
    if limits.tpm:
        life = min(life, counters.tokens_reset_ms / 1000 - WINDOW_MARGIN_S)
    return life


@dataclass(slots=True)
class Allotment:
    limits: Limits
    requests: int
    """Requests left to admit here."""
    tokens: int
    """Tokens left (counted only when the key has tpm or a budget)."""
    counters: Counters
    """The store's counters when it was last granted (the whole grant charged)."""
    granted_at: float
    expires: float
    size: int
    """Requests in the last grant (a refill is asked for when half of them are used)."""
    model: str = ""
    """The model of the request that asked for it (its usage row records the budget given back, adding nothing)."""

    def usable(self, limits: Limits, now: float) -> bool:
        return now < self.expires and self.requests > 0 and same_limits(self.limits, limits)

    def fits(self, cost: int) -> bool:
        return not (self.limits.tpm or self.limits.budget) or cost <= self.tokens

    def take(self, cost: int) -> None:
        self.requests -= 1
        if self.limits.tpm or self.limits.budget:
            self.tokens -= cost

    def low(self, now: float) -> bool:
        """Time to ask for more: half of it used, or near its end."""
        return self.requests * 2 <= self.size or self.expires - now < REFILL_AHEAD_S

    def decision(self, limits: Limits, now: float, inflight: int) -> Decision:
        """An admitted decision for the headers and /admin/limits: the store's counters less what is still unused
        here; `inflight`: the key's requests holding a slot here (a grant counts none)."""
        c, elapsed = self.counters, round((now - self.granted_at) * 1000)
        return Decision(limits, Counters(
            c.requests - self.requests, max(1, c.requests_reset_ms - elapsed),
            c.tokens - self.tokens if limits.tpm else 0, max(1, c.tokens_reset_ms - elapsed) if limits.tpm else 0,
            inflight, c.budget_used - self.tokens if limits.budget else 0))


def carries(left: Allotment | None, limits: Limits, now: float) -> bool:
    """What is left of `left` goes into the next grant's allotment: same limits, still in use (so still in the
    store window the new grant was charged to, which bounds the new one's end too)."""
    return left is not None and now < left.expires and same_limits(left.limits, limits)


def granted(limits: Limits, requests: int, unit: int, counters: Counters, now: float,
            carried: Allotment | None, model: str = "") -> Allotment | None:
    """The allotment after a grant of `requests` x `unit` tokens, with what is left of `carried` (the current one,
    when it `carries`); None when the grant's windows are too near their reset to be used."""
    life = lifetime_s(limits, counters)
    if life <= 0:
        return None
    expires = now + life
    tokens = requests * unit
    if carried is not None:
        requests, tokens = requests + carried.requests, tokens + carried.tokens
    return Allotment(limits, requests, tokens, counters, now, expires, requests, model)
