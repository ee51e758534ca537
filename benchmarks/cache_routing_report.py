"""The pure half of benchmarks/cache_routing.py: run order, medians and spreads, ratios, the table.

Nothing here starts a process or reads a clock, so tests/unit/test_cache_routing_report.py checks it
with made-up runs."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

LEAST_OUTSTANDING = "least_outstanding"
SGLANG = "sglang_router"
ONE_GATEWAY = "one_gateway"

METRICS = ("ttft_p50", "ttft_p90", "output_tps", "computed", "minimum")
"""What one run yields, per variant: TTFT percentiles (s), output tok/s, prompt tokens the engines computed
(their own counters) and the minimum a perfect cache would compute (from the bench)."""


def rotated(variants: Sequence[str], round_index: int) -> list[str]:
    """Round `round_index`'s order: the list shifted left by the round number, so over len(variants)
    rounds each variant runs once in every position (none always first on a quiet machine, or last)."""
    if not variants:
        return []
    shift = round_index % len(variants)
    return [*variants[shift:], *variants[:shift]]


@dataclass(frozen=True)
class Spread:
    """Median and range of one metric over a variant's runs (None where no run measured it)."""

    median: float
    low: float
    high: float
    runs: int

    @classmethod
    def of(cls, values: Sequence[float | None]) -> Spread | None:
        known = [float(v) for v in values if v is not None]
        if not known:
            return None
        return cls(statistics.median(known), min(known), max(known), len(known))


def summarize(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Spread | None]]:
    """variant -> metric -> Spread, over every run of that variant (runs carry "variant" and METRICS)."""
    by_variant: dict[str, list[Mapping[str, Any]]] = {}
    for run in runs:
        by_variant.setdefault(str(run["variant"]), []).append(run)
    return {variant: {m: Spread.of([r.get(m) for r in rs]) for m in METRICS} for variant, rs in by_variant.items()}


def ratio(numerator: Spread | None, denominator: Spread | None) -> float | None:
    """Median over median; None where either is missing or the denominator is zero."""
    if numerator is None or denominator is None or denominator.median == 0:
        return None
    return numerator.median / denominator.median


def _fmt(value: float | None, scale: float, digits: int) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def cell(s: Spread | None, scale: float = 1.0, digits: int = 0) -> str:
    """`median (low-high)`, or `median` alone for one run, or `-`."""
    if s is None:
        return "-"
    if s.runs == 1:
        return _fmt(s.median, scale, digits)
    return f"{_fmt(s.median, scale, digits)} ({_fmt(s.low, scale, digits)}-{_fmt(s.high, scale, digits)})"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def table(summary: Mapping[str, Mapping[str, Spread | None]], order: Sequence[str],
          peers: Sequence[str] = (LEAST_OUTSTANDING, SGLANG)) -> str:
    """The markdown table: medians with (min-max) over the runs; computed/min is tokens computed over the
    minimum; one TTFT gain column per peer: the peer's median TTFT p50 over this variant's (above 1: this one
    answers sooner), `-` where the peer did not run."""
    lines = [
        "| variant | runs | TTFT p50 ms | TTFT p90 ms | output tok/s | prompt tokens computed | minimum | "
        "computed / min | " + " | ".join(f"TTFT p50 gain vs {peer}" for peer in peers) + " |",
        "|---|---|---|---|---|---|---|---|" + "---|" * len(peers),
    ]
    for variant in order:
        s = summary.get(variant)
        if s is None:
            continue
        runs = max((x.runs for x in s.values() if x is not None), default=0)
        computed, minimum = s["computed"], s["minimum"]
        gains = [_x(ratio(summary[peer]["ttft_p50"], s["ttft_p50"]) if peer in summary else None) for peer in peers]
        lines.append(
            f"| {variant} | {runs} | {cell(s['ttft_p50'], 1000)} | {cell(s['ttft_p90'], 1000)} | "
            f"{cell(s['output_tps'], digits=1)} | {cell(computed)} | {cell(minimum)} | {_x(ratio(computed, minimum))} | "
            + " | ".join(gains) + " |"
        )
    return "\n".join(lines)


def across_table(runs: Sequence[Mapping[str, Any]]) -> str:
    """The across-gateways table: per variant, prompt tokens the engines computed (median and range) and that
    over one gateway's (the issue's bound: 1.15x), TTFT p50; failed runs are counted, not averaged."""
    summary = summarize([r for r in runs if "error" not in r])
    one = summary.get(ONE_GATEWAY, {}).get("computed")
    lines = ["| variant | runs | prompt tokens computed | minimum | computed / min | computed / one gateway | TTFT p50 ms |",
             "|---|---|---|---|---|---|---|"]
    for variant in dict.fromkeys(str(r["variant"]) for r in runs):
        failed = sum(1 for r in runs if r["variant"] == variant and "error" in r)
        s = summary.get(variant)
        if s is None:
            lines.append(f"| {variant} | {failed} failed | - | - | - | - | - |")
            continue
        runs_n = max((x.runs for x in s.values() if x is not None), default=0)
        lines.append(f"| {variant} | {runs_n}{f' (+{failed} failed)' if failed else ''} | {cell(s['computed'])} | "
                     f"{cell(s['minimum'])} | {_x(ratio(s['computed'], s['minimum']))} | {_x(ratio(s['computed'], one))} | "
                     f"{cell(s['ttft_p50'], 1000)} |")
    return "\n".join(lines)
