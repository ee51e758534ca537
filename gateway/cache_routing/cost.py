"""What a request costs at each replica: the wait for a slot there plus recomputing the part of its
prompt that replica does not hold, both in seconds, so they can be weighed against each other.

Dynamo's KV router scores `overlap_weight x prefill blocks + decode blocks`; here both terms are
time, measured per replica: its prefill rate (the engine's own timings, else time to first token)
and how long a request holds one of its slots. A request waits at a replica once its slots are
all taken: each of the `ahead` requests in front of it frees a slot on average every
`service_seconds / slots`. A replica whose cache is full (its index's learned capacity) pays too
for what the new part of the prompt evicts there: that many tokens' recompute, weighted by
`EVICTION_WEIGHT` (the chance they are asked for again), so new conversations spread over the
replicas' caches instead of piling onto the one that first held their shared system prompt. Pure: the balancer passes the facts, availability and the bounded load
are its business; ties go to the replica with fewer outstanding requests, then in the order given
(the balancer rotates it, so idle replicas share).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

EVICTION_WEIGHT = 0.5


@dataclass(frozen=True, slots=True)
class Place:
    """One replica as the cost sees it."""

    outstanding: int
    """Requests the gateway has there now, running and waiting."""
    engine_load: float
    """Running and waiting by the engine's own count (a shared upstream's other clients included)."""
    slots: int | None
    """Requests it runs at once; None: the gateway does not cap it (the engine queues on its own)."""
    matched_tokens: float
    """Leading tokens of this prompt it is believed to hold."""
    prompt_tokens: float
    prefill_rate: float
    """Prompt tokens per second it computes, as measured."""
    service_seconds: float
    """How long a request holds one of its slots, as measured."""
    evicted_tokens: float = 0.0
    """Cached tokens of other prompts the new part of this one would push out of its full cache."""


@dataclass(frozen=True, slots=True)
class Estimate:
    wait_seconds: float
    prefill_seconds: float
    eviction_seconds: float = 0.0

    @property
    def seconds(self) -> float:
        return self.wait_seconds + self.prefill_seconds + self.eviction_seconds


def estimate(place: Place) -> Estimate:
    load = max(float(place.outstanding), place.engine_load)
    wait = 0.0  # no gateway cap: the engine batches it at once
    if place.slots:
        wait = max(0.0, load - place.slots + 1) * place.service_seconds / place.slots
    uncached = max(0.0, place.prompt_tokens - place.matched_tokens)
    rate = max(place.prefill_rate, 1e-3)
    return Estimate(wait, uncached / rate, EVICTION_WEIGHT * place.evicted_tokens / rate)


def cheapest(places: Sequence[Place], among: Sequence[int], rivals: Sequence[int] | None = None) -> tuple[int, str]:
    """The index of the cheapest place in `among` (non-empty) and why: `cache_hit` (it holds the most
    of the prompt of all the `rivals`, by default `among`), `cache_load` (another holds more, but
    waiting there costs more than recomputing here, or it is over its bounded load), or `cache_cold`
    (none holds any of it: the least loaded)."""
    best = min(among, key=lambda i: (estimate(places[i]).seconds, places[i].outstanding))
    most = max(places[i].matched_tokens for i in (rivals if rivals is not None else among))
    if most <= 0:
        return best, "cache_cold"
    return best, "cache_hit" if places[best].matched_tokens >= most else "cache_load"
