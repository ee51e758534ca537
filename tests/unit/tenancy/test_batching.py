"""Settlements merged before a write (gateway/tenancy/batching.py): one per key, model, day and limits, the
releases kept as they are, and the same totals."""

from __future__ import annotations

from gateway.tenancy.batching import merged
from gateway.tenancy.store import Settlement, UsageDelta
from tests.stores.key_stores import limits


def usage(name: str, model: str = "m", day: str = "2026-12-01", **counts: int) -> UsageDelta:
    return UsageDelta(name, model, day, **counts)


def test_one_settlement_per_key_model_day_and_limits_with_the_releases_kept() -> None:
    lim, other = limits(rpm=10), limits(rpm=20)
    batch = [
        Settlement("a1", "a", lim, -5, False, usage("a", requests=1, prompt_tokens=4, completion_tokens=3)),
        Settlement("b1", "b", lim, 2, False, usage("b", requests=1)),
        Settlement("lease1", "a", None, 0, True, usage("a")),
        Settlement("a2", "a", lim, -7, False, usage("a", requests=1, prompt_tokens=6, completion_tokens=1, errors=1)),
        Settlement("a3", "a", other, 1, False, usage("a", requests=1)),  # other limits: its own
        Settlement("a4", "a", lim, 0, False, usage("a", "m2", requests=1)),  # another model: its own row
        Settlement("a5", "a", None, 0, False, usage("a", rejected=1)),
        Settlement("a6", "a", None, 0, False, usage("a", rejected=1)),
    ]
    out = merged(batch)
    assert [(s.name, s.usage.model, s.release) for s in out] == [
        ("a", "m", False), ("b", "m", False), ("a", "m", True), ("a", "m", False), ("a", "m2", False), ("a", "m", False)]
    first = out[0]
    assert first.request_id not in {"a1", "a2"} and first.token_delta == -12
    assert (first.usage.requests, first.usage.prompt_tokens, first.usage.completion_tokens, first.usage.errors) == (2, 10, 4, 1)
    assert out[1].request_id == "b1" and out[2].request_id == "lease1"  # alone: unchanged
    assert out[5].limits is None and out[5].usage.rejected == 2


def test_a_batch_of_one_is_itself() -> None:
    one = [Settlement("x", "a", None, 0, False, usage("a", requests=1))]
    assert merged(one) is one
