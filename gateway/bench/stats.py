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


@dataclass
class SessionTrace:
    """One multi-turn session as sent: `own_tokens` is the size, in the bench's words (one token each),
    of what its first prompt holds beyond the shared system prompt (its own system prompt, its
    document, its first user message); `results` its turns in order, up to the first failed one."""

    own_tokens: int
    results: list[RequestResult] = field(default_factory=list)


@dataclass(frozen=True)
class PromptWork:
    """Prompt tokens the endpoint computed against the least a perfect prefix cache would compute."""

    prompt_tokens: int  # sum of usage.prompt_tokens over the answered turns
    computed: int | None  # sum of prompt_tokens - cached_tokens; None: some answer did not report cached tokens
    minimum: int | None  # see minimum_prompt_tokens; None: some answer had no usage counts
    shared_tokens: int  # the shared system prompt as counted once in the minimum (0: none shared)
    ratio: float | None  # computed / minimum


def minimum_prompt_tokens(sessions: Sequence[SessionTrace], shared: bool) -> tuple[int | None, int]:
    """(the prompt tokens a perfect prefix cache computes, the shared part it counts once), from usage.

    A perfect cache computes the shared system prompt once, each session's first prompt beyond it once,
    and for each later turn only what is new since the previous turn's prompt and reply:
    `P(t) - P(t-1) - C(t-1)` (P: usage.prompt_tokens, C: usage.completion_tokens; at least 0). The
    shared part, in the engine's tokens with its chat template, is `min over sessions of P(1) - own`,
    where `own` is the session's own text in words: the template tokens around the session's own text
    are so counted as shared, so the minimum errs low by a few tokens per session, never high. Only
    answered turns count (a session stops at its first failed turn)."""
    answered = [[r for r in s.results if r.ok] for s in sessions]
    if any(r.prompt_tokens is None or r.completion_tokens is None for turns in answered for r in turns):
        return None, 0
    firsts = [(s.own_tokens, turns[0].prompt_tokens or 0) for s, turns in zip(sessions, answered) if turns]
    if not firsts:
        return None, 0
    common = max(0, min(p1 - own for own, p1 in firsts)) if shared else 0
    total = common + sum(p1 - common for _, p1 in firsts)
    for turns in answered:
        for prev, cur in zip(turns, turns[1:]):
            total += max(0, (cur.prompt_tokens or 0) - (prev.prompt_tokens or 0) - (prev.completion_tokens or 0))
    return total, common


def prompt_work(sessions: Sequence[SessionTrace], shared: bool) -> PromptWork:
    ok = [r for s in sessions for r in s.results if r.ok]
    minimum, common = minimum_prompt_tokens(sessions, shared)
    told = all(r.cached_tokens is not None and r.prompt_tokens is not None for r in ok)
    computed = sum((r.prompt_tokens or 0) - (r.cached_tokens or 0) for r in ok) if ok and told else None
    ratio = computed / minimum if computed is not None and minimum else None
    return PromptWork(sum(r.prompt_tokens or 0 for r in ok), computed, minimum, common, ratio)


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
    prompt_work: PromptWork | None = None  # multi-turn sessions only: prompt tokens computed against the minimum


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
