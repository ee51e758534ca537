"""How close a tenant is to its limits, from its policy and the counters its last request found."""

from __future__ import annotations

from gateway.recent.headroom import headroom
from gateway.recent.ring import LimitsSeen
from gateway.tenancy.keys import KeyPolicy
from gateway.tenancy.limits import Counters, Decision, Limits

POLICY = KeyPolicy(rpm=10, tpm=1000, max_concurrency=2, budget_tokens=5000, budget_period="day")
LIMITS = Limits(10, 1000, 2, 5000, 60_000, "2026-12-03", 3_600_000)
SEEN = LimitsSeen(100.0, Decision(LIMITS, Counters(requests=4, requests_reset_ms=30_000, tokens=500,
                                                     tokens_reset_ms=30_000, inflight=1, budget_used=2500)))


def test_counters_within_their_window_are_used_with_the_time_left() -> None:
    h = headroom("a", POLICY, SEEN, now=110.0)
    assert h["limits"]["rpm"] == {"limit": 10, "used": 4, "ratio": 0.4, "resets_in_ms": 20_000}
    assert h["limits"]["tpm"]["used"] == 500 and h["limits"]["tpm"]["ratio"] == 0.5
    assert h["limits"]["concurrency"] == {"limit": 2, "used": 1, "ratio": 0.5, "resets_in_ms": None}
    assert h["limits"]["budget"]["used"] == 2500 and h["limits"]["budget"]["resets_in_ms"] == 3_590_000
    assert h["seen_at"] == 100.0 and h["refused"] is None


def test_a_window_that_ended_since_counts_as_empty() -> None:
    h = headroom("a", POLICY, SEEN, now=140.0)  # 40 s later: the 30 s left of the window are gone
    assert h["limits"]["rpm"] == {"limit": 10, "used": 0, "ratio": 0.0, "resets_in_ms": None}
    assert h["limits"]["budget"]["used"] == 2500  # the day's budget is not over


def test_no_request_seen_and_no_limit_set() -> None:
    h = headroom("b", KeyPolicy(rpm=5), None, now=1.0)
    assert h["limits"]["rpm"] == {"limit": 5, "used": None, "ratio": None, "resets_in_ms": None}
    assert h["limits"]["tpm"] == {"limit": None, "used": None, "ratio": None, "resets_in_ms": None}
    assert h["seen_at"] is None
