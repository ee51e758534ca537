"""Bench statistics on fixed numbers: percentiles, TPOT/ITL arithmetic, goodput, errors."""

from __future__ import annotations

import random

import pytest

from gateway.bench.client import RequestResult
from gateway.bench.stats import SLO, distribution, summarize


def result(ttft: float, e2e: float, tokens: int, *, error: str | None = None, max_tokens: int | None = None,
           times: list[float] | None = None, prompt: int = 10) -> RequestResult:
    return RequestResult(start=100.0, end=100.0 + e2e, error=error, ttft=None if error else ttft,
                         content_times=times or [], prompt_tokens=None if error else prompt,
                         completion_tokens=None if error else tokens,
                         max_tokens=tokens if max_tokens is None else max_tokens)


def test_distribution_percentiles_interpolate_linearly() -> None:
    d = distribution([float(v) for v in range(1, 101)])  # 1..100
    assert d.count == 100
    assert d.p50 == pytest.approx(50.5)
    assert d.p90 == pytest.approx(90.1)
    assert d.p99 == pytest.approx(99.01)
    assert d.max == 100.0 and d.mean == pytest.approx(50.5)


def test_distribution_of_nothing_is_empty_not_zero() -> None:
    d = distribution([])
    assert d.count == 0 and d.p50 is None and d.max is None


def test_single_value_is_every_percentile() -> None:
    d = distribution([0.25])
    assert (d.p50, d.p90, d.p99, d.max) == (0.25, 0.25, 0.25, 0.25)


def test_tpot_and_itl_arithmetic() -> None:
    r = result(0.5, 1.4, 10, times=[0.5, 0.6, 0.8, 1.4])
    assert r.tpot == pytest.approx((1.4 - 0.5) / 9)
    assert r.itls == pytest.approx([0.1, 0.2, 0.6])
    assert result(0.5, 0.5, 1).tpot is None  # one token: no time per output token


def test_goodput_counts_requests_meeting_every_slo() -> None:
    slo = SLO(ttft=1.0, tpot=0.1)
    samples = [
        result(0.5, 0.5 + 9 * 0.05, 10),  # meets both
        result(1.5, 1.5 + 9 * 0.05, 10),  # TTFT too slow
        result(0.5, 0.5 + 9 * 0.2, 10),  # TPOT too slow
        result(0.9, 0.9 + 9 * 0.1, 10),  # exactly on both limits: meets
        result(0.2, 0.2, 1),  # one token: TPOT undefined, TTFT fine: meets
        result(0.1, 0.3, 0, error="http_500"),  # failures never meet an SLO
    ]
    stats = summarize("c=1", samples, duration_s=2.0, slo=slo)
    assert stats.goodput_fraction == pytest.approx(3 / 6)
    assert stats.goodput_rps == pytest.approx(3 / 2.0)
    assert stats.ok == 5 and stats.sent == 6
    assert stats.errors == {"http_500": 1}


def test_e2e_slo() -> None:
    slo = SLO(e2e=1.0)
    assert slo.met(result(0.1, 1.0, 5)) and not slo.met(result(0.1, 1.01, 5))
    assert slo.describe() == "E2E <= 1000 ms"


def test_no_slo_gives_no_goodput() -> None:
    stats = summarize("c=1", [result(0.1, 0.2, 2)], 1.0, SLO())
    assert stats.goodput_rps is None and stats.goodput_fraction is None


def test_throughput_uses_usage_counts_over_the_duration() -> None:
    samples = [result(0.1, 1.0, 20, prompt=7), result(0.1, 1.0, 30, prompt=3), result(0, 0.1, 0, error="timeout")]
    stats = summarize("c=2", samples, duration_s=4.0, slo=SLO())
    assert stats.output_tps == pytest.approx(50 / 4.0)
    assert stats.input_tps == pytest.approx(10 / 4.0)
    assert stats.request_rate == pytest.approx(2 / 4.0)
    assert stats.completion_tokens == 50 and stats.prompt_tokens == 10
    assert stats.e2e.count == 2  # latency only over successful requests


def test_percentiles_match_a_sorted_reference() -> None:
    rng = random.Random(3)
    values = [rng.expovariate(5.0) for _ in range(1000)]
    ordered = sorted(values)
    d = distribution(values)
    # linear interpolation at rank p/100 * (n - 1)
    rank = 0.99 * (len(ordered) - 1)
    lo = int(rank)
    expected = ordered[lo] + (ordered[lo + 1] - ordered[lo]) * (rank - lo)
    assert d.p99 == pytest.approx(expected)


def test_length_held_reports_short_answers() -> None:
    held = summarize("c=1", [result(0.1, 1, 8, max_tokens=8)], 1.0, SLO())
    short = summarize("c=1", [result(0.1, 1, 8, max_tokens=8), result(0.1, 1, 5, max_tokens=8)], 1.0, SLO())
    assert held.length_held == "yes"
    assert short.length_held == "no (1 of 2 off the requested length)"


def test_summarize_rejects_a_zero_duration() -> None:
    with pytest.raises(ValueError):
        summarize("c=1", [], 0.0, SLO())
