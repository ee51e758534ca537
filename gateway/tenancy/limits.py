"""The limit rule and everything derived from one decision (headers, the 429), as pure functions.

The store applies `check` atomically with the charge (a Lua script in Redis, one transaction in
SQLite), so concurrent requests in several gateway processes never both take the last unit.

Windows: rpm and tpm count over `window_seconds`, a window that starts with its first request
(so a burst gets exactly `rpm`, whatever the clock says).

Tokens: admission reserves the most the request can spend (`reservation`): the prompt's estimate
(gateway/request_view: text by script, media a fixed count, tools by their JSON, the chat
template's overhead) plus its output limit times its choices (`max_tokens` x `n`; unset, the
model's context length per choice, else DEFAULT_OUTPUT_TOKENS). The settle replaces it with what
the engine counted (prompt and completion), refunding the difference; the stores clamp a window
or a budget at 0. An engine never generates past the limit, so the only tokens spent beyond a
reservation are the prompt's, where the engine counts more than the estimate.

The bound: a budget (or a tpm window) is overspent by at most the sum, over the requests in flight
when it ran out, of each one's (engine prompt tokens - estimate) where positive. For natural text
that is 0 to a few tokens a request (the estimate runs high: see gateway/request_view/estimate.py
for the ratios measured); text made to defeat the estimate (random characters) can reach one
token per UTF-8 byte of its prompt. One more way past it, not closed here: a request that outlives
its tpm window refunds its unused reservation into the next window, lowering that window's count by
at most the refund (budgets are not affected: the settle names the reservation's period).
A `max_tokens` the engine does not honour (an engine that ignores it) is outside the bound."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal

from gateway.request_view import RequestView
from gateway.tenancy.keys import BudgetPeriod, KeyPolicy

Refusal = Literal["requests", "tokens", "concurrency", "budget", "revoked"]
"""`revoked`: the store no longer holds the key under the secret it was authenticated with (nothing charged)."""
DEFAULT_OUTPUT_TOKENS = 4096
"""A choice's reservation when the request sets no output limit and the engine reports no context length."""


@dataclass(frozen=True, slots=True)
class Limits:
    rpm: int | None
    tpm: int | None
    concurrency: int | None
    budget: int | None
    window_ms: int
    budget_period: str
    """The budget period's id (2026-12-01 or 2026-12): the store's counter is per period."""
    budget_reset_ms: int
    """Milliseconds from the decision until the budget period ends."""

    @classmethod
    def of(cls, policy: KeyPolicy, now: float) -> Limits:
        period, reset_ms = budget_period(policy.budget_period, now)
        return cls(policy.rpm, policy.tpm, policy.max_concurrency, policy.budget_tokens,
                   max(1, round(policy.window_seconds * 1000)), period, reset_ms)


@dataclass(frozen=True, slots=True)
class Counters:
    requests: int = 0
    requests_reset_ms: int = 0
    tokens: int = 0
    tokens_reset_ms: int = 0
    inflight: int = 0
    budget_used: int = 0


@dataclass(frozen=True, slots=True)
class Decision:
    limits: Limits
    counters: Counters
    """After the charge when admitted; as found when refused."""
    refused: Refusal | None = None

    @property
    def admitted(self) -> bool:
        return self.refused is None


def check(limits: Limits, counters: Counters, cost: int) -> Refusal | None:
    """The rule, in this order. A prompt alone larger than tpm still passes in an empty window
    (it could never pass otherwise); a budget is never entered beyond its size."""
    if limits.rpm is not None and counters.requests >= limits.rpm:
        return "requests"
    if limits.tpm is not None and counters.tokens > 0 and counters.tokens + cost > limits.tpm:
        return "tokens"
    if limits.concurrency is not None and counters.inflight >= limits.concurrency:
        return "concurrency"
    if limits.budget is not None and counters.budget_used + cost > limits.budget:
        return "budget"
    return None


def budget_period(period: BudgetPeriod, now: float) -> tuple[str, int]:
    """The UTC day's or month's id and the milliseconds until it ends. Asked on every request: the current
    period's bounds are kept (one datetime computation per period, not per call)."""
    bounds = _bounds.get(period)
    if bounds is None or not bounds[0] <= now < bounds[1]:
        bounds = _bounds[period] = _period_bounds(period, now)
    return bounds[2], max(1, math.ceil((bounds[1] - now) * 1000))


_bounds: dict[str, tuple[float, float, str]] = {}


def _period_bounds(period: BudgetPeriod, now: float) -> tuple[float, float, str]:
    """(start, end, id) of the UTC day or month holding `now`."""
    t = datetime.fromtimestamp(now, timezone.utc)
    if period == "day":
        start = t.replace(hour=0, minute=0, second=0, microsecond=0)
        return start.timestamp(), start.timestamp() + 86400, start.strftime("%Y-%m-%d")
    first = datetime(t.year, t.month, 1, tzinfo=timezone.utc)
    nxt = datetime(t.year + (t.month == 12), t.month % 12 + 1, 1, tzinfo=timezone.utc)
    return first.timestamp(), nxt.timestamp(), t.strftime("%Y-%m")


@dataclass(frozen=True, slots=True)
class Reservation:
    """What admission charges a request: its prompt's estimate and the most its completions can be."""

    prompt: int
    output: int

    @property
    def tokens(self) -> int:
        return self.prompt + self.output


def reservation(view: RequestView, context_length: int | None) -> Reservation:
    """The prompt's estimate plus the output limit times the choices; an unset limit is the model's
    context per choice (the engine stops there), else DEFAULT_OUTPUT_TOKENS."""
    per_choice = view.max_output
    if per_choice is None:
        per_choice = context_length if context_length and context_length > 0 else DEFAULT_OUTPUT_TOKENS
    return Reservation(max(1, view.prompt_tokens), per_choice * view.choices)


def retry_after_ms(decision: Decision, default_ms: int) -> int:
    c, limits = decision.counters, decision.limits
    return {"requests": c.requests_reset_ms, "tokens": c.tokens_reset_ms, "budget": limits.budget_reset_ms}.get(
        decision.refused or "", default_ms) or default_ms


def refusal_message(decision: Decision, cost: int | None = None) -> str:
    """The 429's message for a refused decision (`cost`: the request's reservation, when known)."""
    limits, c = decision.limits, decision.counters
    window = _duration(limits.window_ms)
    if decision.refused == "requests":
        return f"Rate limit reached for requests: limit {limits.rpm} per {window}, used {c.requests}."
    if decision.refused == "tokens":
        return f"Rate limit reached for tokens: limit {limits.tpm} per {window}, used {c.tokens}."
    if decision.refused == "concurrency":
        return f"Too many concurrent requests: limit {limits.concurrency}."
    left = max(0, (limits.budget or 0) - c.budget_used)
    if cost is not None and cost > left > 0:
        return (f"This request may use up to {cost} tokens (its prompt's estimate plus max_tokens times n), more than "
                f"the {left} left of its key's budget of {limits.budget} in {limits.budget_period}; ask for fewer "
                "output tokens or choices.")
    return (f"Token budget exhausted: {c.budget_used} of {limits.budget} used in {limits.budget_period}; "
            "it renews when the period ends.")


def _windows(decision: Decision) -> Iterator[tuple[str, int, int, int]]:
    """(kind, limit, remaining, ms to reset) for the windowed limits the key has."""
    limits, c = decision.limits, decision.counters
    for kind, limit, used, reset_ms in (("requests", limits.rpm, c.requests, c.requests_reset_ms),
                                        ("tokens", limits.tpm, c.tokens, c.tokens_reset_ms)):
        if limit is not None:
            yield kind, limit, max(0, limit - used), reset_ms or limits.window_ms


def rate_headers(decision: Decision) -> list[tuple[bytes, bytes]]:
    """OpenAI's x-ratelimit-* headers for the limits the key has."""
    out: list[tuple[bytes, bytes]] = []
    for kind, limit, remaining, reset_ms in _windows(decision):
        out += [(f"x-ratelimit-limit-{kind}".encode(), str(limit).encode()),
                (f"x-ratelimit-remaining-{kind}".encode(), str(remaining).encode()),
                (f"x-ratelimit-reset-{kind}".encode(), _duration(reset_ms).encode())]
    return out


def anthropic_headers(decision: Decision, now: float) -> list[tuple[bytes, bytes]]:
    """Anthropic's anthropic-ratelimit-* headers (the reset as an RFC 3339 time)."""
    out: list[tuple[bytes, bytes]] = []
    for kind, limit, remaining, reset_ms in _windows(decision):
        reset = datetime.fromtimestamp(now + reset_ms / 1000, timezone.utc).isoformat(timespec="seconds")
        out += [(f"anthropic-ratelimit-{kind}-limit".encode(), str(limit).encode()),
                (f"anthropic-ratelimit-{kind}-remaining".encode(), str(remaining).encode()),
                (f"anthropic-ratelimit-{kind}-reset".encode(), reset.replace("+00:00", "Z").encode())]
    return out


def _duration(ms: int) -> str:
    """OpenAI's reset format: 850ms, 12s, 1m30s, 2h0m0s."""
    if ms < 1000:
        return f"{ms}ms"
    s = math.ceil(ms / 1000)
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s}s"
    h, m = divmod(m, 60)
    return f"{h}h{m}m{s}s"
