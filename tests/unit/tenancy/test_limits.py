"""The limit rule as a table, run three ways: the pure `check`, the SQLite store and a real Redis
(the Lua script) — the stores must decide exactly as the rule does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gateway.tenancy.keys import KeyPolicy
from gateway.tenancy.limits import (
    Counters,
    Decision,
    Limits,
    anthropic_headers,
    budget_period,
    check,
    rate_headers,
    refusal_message,
)
from gateway.tenancy.store import KeyStore, Settlement, UsageDelta
from tests.stores.key_stores import STORES, Clients

NOW = 1_796_165_000.0  # 2026-12-01
# name, policy fields, [(cost, expected refusal)] in order
SCENARIOS: list[tuple[str, dict[str, Any], list[tuple[int, str | None]]]] = [
    ("rpm 3: the fourth is refused", {"rpm": 3}, [(1, None), (1, None), (1, None), (1, "requests")]),
    ("tpm 10: prompts are charged", {"tpm": 10}, [(6, None), (4, None), (1, "tokens")]),
    ("tpm: a prompt over tpm passes an empty window only", {"tpm": 5}, [(9, None), (1, "tokens")]),
    ("concurrency 2", {"max_concurrency": 2}, [(1, None), (1, None), (1, "concurrency")]),
    ("budget 10", {"budget_tokens": 10}, [(5, None), (5, None), (1, "budget")]),
    ("budget: never entered beyond its size", {"budget_tokens": 10}, [(11, "budget"), (10, None), (1, "budget")]),
    ("a refused request charges nothing", {"rpm": 2, "budget_tokens": 5}, [(6, "budget"), (1, None), (1, None), (1, "requests")]),
    ("requests are checked before tokens", {"rpm": 1, "tpm": 1}, [(1, None), (1, "requests")]),
    ("no limits", {}, [(10**6, None)] * 3),
]


def limits(**fields: Any) -> Limits:
    return Limits.of(KeyPolicy(**fields), NOW)


@pytest.mark.parametrize(("name", "fields", "steps"), SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_rule(name: str, fields: dict[str, Any], steps: list[tuple[int, str | None]]) -> None:
    lim = limits(**fields)
    c = Counters()
    for cost, expected in steps:
        refused = check(lim, c, cost)
        assert refused == expected, name
        if refused is None:
            c = Counters(c.requests + 1, 0, c.tokens + cost, 0, c.inflight + 1, c.budget_used + cost)


@pytest_asyncio.fixture(params=["sqlite", "redis"])
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[KeyStore, KeyStore]]:
    """Two store clients on the same data, as two gateway processes have."""
    made = Clients(STORES[request.param](request, tmp_path))
    yield made(), made()
    await made.close()


@pytest.mark.parametrize(("name", "fields", "steps"), SCENARIOS, ids=[s[0] for s in SCENARIOS])
async def test_stores_decide_as_the_rule(stores: tuple[KeyStore, KeyStore], name: str, fields: dict[str, Any],
                                         steps: list[tuple[int, str | None]]) -> None:
    lim = limits(**fields)
    for i, (cost, expected) in enumerate(steps):
        decision = await stores[i % 2].reserve("k", lim, cost, f"k{i}")  # alternate clients: one shared count
        assert decision.refused == expected, f"{name}: step {i}"


async def test_a_burst_from_two_clients_gets_exactly_the_limit(stores: tuple[KeyStore, KeyStore]) -> None:
    lim = limits(rpm=20, max_concurrency=1000)
    decisions = await asyncio.gather(*(stores[i % 2].reserve("burst", lim, 1, f"b{i}") for i in range(60)))
    assert sum(d.admitted for d in decisions) == 20
    assert sorted(d.counters.requests for d in decisions if d.admitted) == list(range(1, 21))


async def test_settle_frees_the_slot_and_charges_the_completion(stores: tuple[KeyStore, KeyStore]) -> None:
    a, b = stores
    lim = limits(max_concurrency=1, budget_tokens=100, tpm=1000)
    assert (await a.reserve("s", lim, 10, "r1")).admitted
    assert (await b.reserve("s", lim, 10, "rx")).refused == "concurrency"
    usage = UsageDelta("s", "m", "2026-12-01", requests=1, prompt_tokens=8, completion_tokens=30)
    await a.settle([Settlement("r1", "s", lim, 8 - 10 + 30, True, usage)])
    after = await b.reserve("s", lim, 10, "r3")
    assert after.admitted and after.counters.budget_used == 10 + 28 + 10 and after.counters.tokens == 48
    await b.settle([Settlement("r2", "s", lim, 0, True, usage)])
    rows = await a.usage("s")
    assert rows == [{"name": "s", "model": "m", "day": "2026-12-01", "requests": 2, "prompt_tokens": 16,
                     "completion_tokens": 60, "errors": 0, "rejected": 0, "engine_ms": 0}]
    assert await a.usage("s", since="2026-12-02") == []


async def test_the_window_starts_again_after_window_seconds(stores: tuple[KeyStore, KeyStore]) -> None:
    lim = limits(rpm=1, window_seconds=0.3)
    first = await stores[0].reserve("w", lim, 1, "w1")
    assert first.admitted and 0 < first.counters.requests_reset_ms <= 300
    refused = await stores[1].reserve("w", lim, 1, "w2")
    assert refused.refused == "requests" and 0 < refused.counters.requests_reset_ms <= 300
    await asyncio.sleep(0.35)
    assert (await stores[1].reserve("w", lim, 1, "w3")).admitted


def test_budget_periods_are_utc_days_and_months() -> None:
    assert budget_period("day", NOW) == ("2026-12-01", 86400_000 - (NOW % 86400) * 1000)
    period, reset_ms = budget_period("month", NOW)
    assert period == "2026-12" and reset_ms == round((1798761600.0 - NOW) * 1000)  # 2027-01-01


@pytest.mark.parametrize("period", ["day", "month"])
def test_a_budget_period_asked_on_each_side_of_its_end_is_the_right_one(period: str) -> None:
    """The kept bounds of the current period never answer for a time outside it (later, or earlier: a clock
    stepped back), whatever order the times come in."""
    from datetime import datetime, timezone

    month_end = 1798761600.0  # 2027-01-01T00:00Z: a day's, a month's and a year's end at once
    times = [NOW, month_end - 0.001, month_end, month_end + 1, month_end - 1, NOW, month_end + 86400 * 40, NOW]
    for t in times:
        found, reset_ms = budget_period(period, t)  # type: ignore[arg-type]
        d = datetime.fromtimestamp(t, timezone.utc)
        assert found == d.strftime("%Y-%m-%d" if period == "day" else "%Y-%m"), t
        assert 1 <= reset_ms <= (86400_000 if period == "day" else 31 * 86400_000)
    assert budget_period(period, month_end - 0.0001)[1] == 1  # type: ignore[arg-type]


def test_headers_and_the_429() -> None:
    lim = limits(rpm=60, tpm=1000, budget_tokens=50)
    admitted = Decision(lim, Counters(requests=3, requests_reset_ms=59_000, tokens=400, tokens_reset_ms=1500))
    assert dict(rate_headers(admitted)) == {
        b"x-ratelimit-limit-requests": b"60", b"x-ratelimit-remaining-requests": b"57",
        b"x-ratelimit-reset-requests": b"59s", b"x-ratelimit-limit-tokens": b"1000",
        b"x-ratelimit-remaining-tokens": b"600", b"x-ratelimit-reset-tokens": b"2s"}
    anthropic = dict(anthropic_headers(admitted, NOW))
    assert anthropic[b"anthropic-ratelimit-requests-remaining"] == b"57"
    assert anthropic[b"anthropic-ratelimit-tokens-reset"] == b"2026-12-01T22:43:21Z"
    assert refusal_message(Decision(lim, Counters(requests=60), "requests")).startswith("Rate limit reached for requests")
    assert "50 of 50" in refusal_message(Decision(lim, Counters(budget_used=50), "budget"))
    assert rate_headers(Decision(limits(budget_tokens=5), Counters())) == []  # no rpm/tpm: no headers
