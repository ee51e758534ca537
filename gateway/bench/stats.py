"""Statistics of one load level: percentiles, throughput, goodput under SLOs, errors."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from gateway.bench.client import RequestResult


@dataclass(frozen=True)
class Dist:
    """Seconds; every field None when there were no samples."""

    count: int
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    max: float | None = None


def distribution(values: Sequence[float]) -> Dist:
    if not values:
        return Dist(0)
    arr = np.asarray(values, dtype=float)
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])  # linear interpolation between closest ranks
    return Dist(len(arr), float(arr.mean()), float(p50), float(p90), float(p99), float(arr.max()))


@dataclass(frozen=True)
class SLO:
    """Per-request limits in seconds; None: no limit on that metric."""

    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None

    @property
    def empty(self) -> bool:
        return self.ttft is None and self.tpot is None and self.e2e is None

    def met(self, r: RequestResult) -> bool:
        """A failed request never meets it; a one-token answer has no TPOT and passes that limit."""
        if not r.ok:
            return False
        if self.ttft is not None and (r.ttft is None or r.ttft > self.ttft):
            return False
        if self.tpot is not None and r.tpot is not None and r.tpot > self.tpot:
            return False
        return self.e2e is None or r.e2e <= self.e2e

    def describe(self) -> str:
        parts = [f"{name} <= {value * 1000:g} ms" for name, value in
                 (("TTFT", self.ttft), ("TPOT", self.tpot), ("E2E", self.e2e)) if value is not None]
        return " and ".join(parts) or "none"


@dataclass(frozen=True)
class TurnStats:
    """One turn of every session at a level: later turns carry longer conversations."""

    turn: int
    sent: int
    ok: int
    prompt_tokens_mean: float | None  # from usage; None when no answer reported it
    ttft: Dist
    cached_fraction: float | None = None  # of the prompt tokens, the share served from the endpoint's cache


@dataclass(frozen=True)
class LevelStats:
    label: str
    sent: int
    ok: int
    errors: dict[str, int]
    error_examples: dict[str, str]
    duration_s: float
    request_rate: float
    input_tps: float | None  # None: some answers had no prompt count (no usage, no tokenizer)
    output_tps: float
    ttft: Dist
    tpot: Dist
    itl: Dist
    e2e: Dist
    goodput_rps: float | None
    goodput_fraction: float | None
    prompt_tokens: int
    completion_tokens: int
    token_sources: dict[str, int]
    length_held: str
    client_cpu_fraction: float
    content_event_rate: float
    retried: int = 0
    notes: list[str] = field(default_factory=list)
    turns: list[TurnStats] = field(default_factory=list)  # multi-turn sessions only: one entry per turn
    cached_fraction: float | None = None  # prompt tokens served from the endpoint's cache, where usage says


def cached_fraction(results: Sequence[RequestResult]) -> float | None:
    """Share of prompt tokens the endpoint reported cached (`usage.prompt_tokens_details.cached_tokens`),
    over the answers that reported it; None when none did."""
    told = [r for r in results if r.ok and r.cached_tokens is not None and r.prompt_tokens]
    total = sum(r.prompt_tokens or 0 for r in told)
    return sum(r.cached_tokens or 0 for r in told) / total if total else None


def per_turn(results: Sequence[RequestResult]) -> list[TurnStats]:
    turns = sorted({r.turn for r in results if r.turn is not None})
    out = []
    for turn in turns:
        sent = [r for r in results if r.turn == turn]
        ok = [r for r in sent if r.ok]
        prompts = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
        out.append(TurnStats(turn, len(sent), len(ok), sum(prompts) / len(prompts) if prompts else None,
                             distribution([r.ttft for r in ok if r.ttft is not None]), cached_fraction(ok)))
    return out


def _length_held(ok: list[RequestResult]) -> str:
    counted = [r for r in ok if r.completion_tokens is not None]
    if not counted:
        return "unknown"
    short = sum(1 for r in counted if r.completion_tokens != r.max_tokens)
    return "yes" if short == 0 else f"no ({short} of {len(counted)} off the requested length)"


def summarize(label: str, results: Sequence[RequestResult], duration_s: float, slo: SLO,
              client_cpu_s: float = 0.0) -> LevelStats:
    """`duration_s`: from the level's first send to its last completion."""
    if duration_s <= 0:
        raise ValueError("duration_s must be positive")
    ok = [r for r in results if r.ok]
    errors = Counter(r.error for r in results if r.error is not None)
    examples: dict[str, str] = {}
    for r in results:
        if r.error is not None and r.error not in examples:
            examples[r.error] = r.detail or ""
    prompt = sum(r.prompt_tokens or 0 for r in ok)
    completion = sum(r.completion_tokens or 0 for r in ok)
    good = sum(1 for r in results if slo.met(r)) if not slo.empty else None
    notes = []
    if any(not r.streamed for r in ok):
        notes.append("not streamed: TTFT equals end-to-end latency")
    if any(r.ok and r.ttft is None for r in results):
        notes.append(f"{sum(1 for r in ok if r.ttft is None)} successful requests returned no content")
    if retried := sum(r.retried for r in results):
        notes.append(f"{label}: {retried} requests resent once on a new connection (the server had closed the "
                     "pooled one before answering); their clocks start at the resend")
    return LevelStats(
        label=label,
        sent=len(results),
        ok=len(ok),
        errors=dict(sorted(errors.items())),
        error_examples=examples,
        duration_s=duration_s,
        request_rate=len(ok) / duration_s,
        input_tps=prompt / duration_s if all(r.prompt_tokens is not None for r in ok) else None,
        output_tps=completion / duration_s,
        ttft=distribution([r.ttft for r in ok if r.ttft is not None]),
        tpot=distribution([t for r in ok if (t := r.tpot) is not None]),
        itl=distribution([gap for r in ok for gap in r.itls]),
        e2e=distribution([r.e2e for r in ok]),
        goodput_rps=None if good is None else good / duration_s,
        goodput_fraction=None if good is None or not results else good / len(results),
        prompt_tokens=prompt,
        completion_tokens=completion,
        token_sources=dict(Counter(r.token_source for r in ok)),
        length_held=_length_held(ok),
        client_cpu_fraction=client_cpu_s / duration_s,
        content_event_rate=sum(len(r.content_times) for r in results) / duration_s,
        retried=sum(r.retried for r in results),
        notes=notes,
        cached_fraction=cached_fraction(ok),
    )
