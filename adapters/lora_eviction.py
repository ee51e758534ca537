"""Which LoRA adapter to load, evict or wait for, when the gateway loads adapters at run time (pure; the loading
itself is adapters/lora_runtime.py).

The engine holds at most `capacity` adapters. A request for one that is loaded uses it; one being loaded waits
for that load (two first requests load it once); otherwise it is loaded into a free place, or into the place of
the least recently used adapter that no request is using (a request in flight keeps its adapter); when every
place is held by requests in flight, the request waits for one to finish."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class Held:
    last_used: int
    """A sequence number: larger is more recent."""
    in_flight: int


@dataclass(frozen=True, slots=True)
class Decision:
    action: Literal["use", "join", "load", "wait"]
    evict: str | None = None


USE = Decision("use")
JOIN = Decision("join")
WAIT = Decision("wait")


def decide(wanted: str, held: Mapping[str, Held], loading: frozenset[str], capacity: int) -> Decision:
    """`held`: the adapters loaded now; `loading`: those whose load is under way (each takes a place)."""
    if wanted in held:
        return USE
    if wanted in loading:
        return JOIN
    if len(held) + len(loading) < max(1, capacity):
        return Decision("load")
    idle = [(h.last_used, name) for name, h in held.items() if h.in_flight == 0]
    if not idle:
        return WAIT
    return Decision("load", evict=min(idle)[1])
