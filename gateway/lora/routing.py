"""Which replica a request for a LoRA adapter goes to: one that has the adapter loaded, unless it is much busier.

The cost rule: a replica's wait is its outstanding requests per slot (`outstanding / slots`, in rounds of
its batch); a replica without the adapter also pays `LOAD_ROUNDS` for loading it (vLLM/SGLang load an
adapter into a GPU slot before the request's first step, evicting the least recently used one, which the
next request for that one pays again). So the request goes to the least-waiting replica that has the
adapter unless its wait exceeds the balancer's choice's by more than `LOAD_ROUNDS`: "much busier" is a
whole round of its slots more. Replicas that cannot take a request (down, full) are not candidates."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

LOAD_ROUNDS = 1.0
"""What loading an adapter costs, in rounds of the replica's slots (one more request in every slot)."""


@dataclass(frozen=True, slots=True)
class AdapterPlace:
    outstanding: int
    slots: int | None  # None: no cap (counted as one slot)
    loaded: bool
    available: bool = True


def wait_rounds(p: AdapterPlace) -> float:
    return p.outstanding / max(1, p.slots or 1)


def choose(places: Sequence[AdapterPlace], chosen: int) -> tuple[int, str | None]:
    """The replica for the request, given the balancer's `chosen` index: (index, reason or None when kept)."""
    if not places or places[chosen].loaded:
        return chosen, None
    loaded = [i for i, p in enumerate(places) if p.loaded and p.available]
    if not loaded:
        return chosen, None
    best = min(loaded, key=lambda i: (wait_rounds(places[i]), i))
    if wait_rounds(places[best]) - wait_rounds(places[chosen]) <= LOAD_ROUNDS:
        return best, "adapter_loaded"
    return chosen, "adapter_load"
