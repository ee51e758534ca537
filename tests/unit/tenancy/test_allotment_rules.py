"""The allotment rules (gateway/tenancy/allotment.py) as tables: the grant's size, its lifetime, what a
request takes, and the counters its headers show."""

from __future__ import annotations

import pytest

from gateway.tenancy.allotment import (
    DEMAND_WINDOW_S,
    MAX_GRANT,
    TTL_S,
    WINDOW_MARGIN_S,
    Allotment,
    Demand,
    carries,
    grant_size,
    granted,
)
from gateway.tenancy.keys import KeyPolicy
from gateway.tenancy.limits import Counters, Limits

NOW = 1_796_165_000.0


def limits(**fields: object) -> Limits:
    return Limits.of(KeyPolicy(**fields), NOW)  # type: ignore[arg-type]


def demand(recent: int, unit: float = 100) -> Demand:
    return Demand(started=0.0, current=recent, last=0, unit_cost=unit)


@pytest.mark.parametrize(("lim", "counters", "recent", "expected"), [
    (limits(rpm=10_000), None, 50, (0, 0)),  # the store has not answered once
    (limits(rpm=10_000), Counters(), 1, (0, 0)),  # quiet: every request asks the store
    (limits(rpm=10_000), Counters(), 50, (100, 0)),  # twice what it used: requests only, no token limit
    (limits(rpm=10_000), Counters(), 500, (MAX_GRANT, 0)),
    (limits(rpm=100), Counters(requests=60), 50, (5, 0)),  # 1/8 of the 40 left
    (limits(rpm=100), Counters(requests=90), 50, (0, 0)),  # near the edge: none
    (limits(tpm=100_000), Counters(tokens=20_000), 40, (80, 100)),
    (limits(tpm=10_000), Counters(tokens=2_000), 50, (10, 100)),  # 8000 left / 8 / 100 per request
    (limits(budget_tokens=10_000), Counters(budget_used=9_000), 50, (0, 0)),
    (limits(budget_tokens=1_000_000), Counters(budget_used=200_000), 50, (100, 100)),
    (limits(budget_tokens=500_000), Counters(budget_used=200_000), 50, (46, 100)),  # 300,000 left / 64 / 100
    (limits(budget_tokens=100_000, rpm=10_000), Counters(), 20, (15, 100)),  # 100,000 / 64 / 100
])
def test_grant_size(lim: Limits, counters: Counters | None, recent: int, expected: tuple[int, int]) -> None:
    assert grant_size(demand(recent), lim, counters) == expected


def test_demand_counts_the_current_and_last_window_and_follows_the_larger_reservations() -> None:
    d = Demand()
    for i in range(5):
        d.seen(10.0 + i * 0.001, 100)
    assert d.recent == 5
    d.seen(10.0 + DEMAND_WINDOW_S * 1.01, 300)  # a new window: the last one's 5 still count
    assert (d.current, d.last, d.recent) == (1, 5, 5)
    assert d.unit_cost == 300  # a larger reservation is followed at once, a smaller one slowly
    d.seen(10.0 + 4 * DEMAND_WINDOW_S, 100)  # a window with nothing between: the last one is forgotten
    assert (d.current, d.last) == (1, 0) and 100 < d.unit_cost < 300


def test_an_allotment_ends_before_its_window_and_merges_with_what_is_left() -> None:
    lim = limits(rpm=10_000, tpm=1_000_000)
    far = Counters(requests=10, requests_reset_ms=60_000, tokens=1000, tokens_reset_ms=60_000)
    a = granted(lim, 10, 100, far, 5.0, None)
    assert a is not None and a.expires == 5.0 + TTL_S and (a.requests, a.tokens) == (10, 1000)
    near = Counters(requests=30, requests_reset_ms=300, tokens=3000, tokens_reset_ms=60_000)
    b = granted(lim, 20, 100, near, 5.5, a)  # its window resets in 0.3 s
    assert b is not None and (b.requests, b.tokens) == (30, 3000)
    assert b.expires == pytest.approx(5.5 + 0.3 - WINDOW_MARGIN_S)
    assert granted(lim, 5, 100, Counters(requests_reset_ms=20, tokens_reset_ms=20), 6.0, None) is None
    assert carries(a, lim, 5.5) and not carries(a, lim, 6.0)  # ended: nothing carried over
    assert not carries(a, limits(rpm=5_000), 5.5) and not carries(None, lim, 5.5)  # another policy, or none
    other = granted(limits(rpm=5_000), 4, 0, far, 5.5, None)
    assert other is not None and other.requests == 4


def test_a_request_takes_one_request_and_its_tokens_and_the_headers_count_what_is_unused_here() -> None:
    lim = limits(rpm=1000, tpm=100_000, budget_tokens=1_000_000)
    a = Allotment(lim, requests=4, tokens=400, counters=Counters(requests=40, requests_reset_ms=30_000, tokens=4000,
                  tokens_reset_ms=30_000, budget_used=9000), granted_at=1.0, expires=2.0, size=4)
    assert a.usable(lim, 1.5) and a.fits(100) and not a.fits(401)
    assert not a.usable(lim, 2.0) and not a.usable(limits(rpm=1000), 1.5)
    a.take(150)
    assert (a.requests, a.tokens, a.low(1.5)) == (3, 250, False)
    assert a.low(1.9)  # near its end
    a.take(100)
    assert a.low(1.5)
    c = a.decision(lim, 1.5, 3).counters
    assert (c.requests, c.tokens, c.budget_used) == (38, 3850, 8850)  # the store's counts less the 2 and 150 unused
    assert c.inflight == 3
    assert c.requests_reset_ms == 29_500
