"""Which replica serves a request: load first, or the replica that holds its prefix cache, bounded.

Pure: the caller passes a snapshot of each replica (`Candidate`) and the request's key; the
answer is an index and the reason, which the gateway counts per replica.

Affinity uses rendezvous (highest-random-weight) hashing with bounded loads: each key ranks
the replicas by hash(key, replica name) and goes to the first one in its ranking whose
outstanding requests are below ceil(load_factor * (total + 1) / usable replicas). This is the
bound of consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018) with a
simpler, exactly uniform placement: no ring and no virtual nodes to tune (a ring over two or
three replicas is lumpy unless it has hundreds of points), a replica that leaves moves only its
own keys (to each key's next choice, the same fallback every time), and a key comes back to its
home replica when that replica does. One hot key spills to its second choice, then its third,
as soon as its home holds more than its share plus the margin. A replica where requests already
queue (in the gateway, or in its engine by its own waiting count or a full KV cache) is treated
as over the bound while another is not.

`affinity: cache` weighs each replica by cost instead (gateway/cache_routing/cost.py): the wait
for a slot there against recomputing the part of the prompt it does not hold; the same bound
keeps one hot prefix from sinking a replica.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from gateway.cache_routing.cost import Place, cheapest

Balance = Literal["least_outstanding", "round_robin"]
Affinity = Literal["none", "prefix", "session", "cache"]
REASONS = ("least_outstanding", "round_robin", "affinity", "affinity_spill", "affinity_failover",
           "cache_hit", "cache_load", "cache_cold", "probe", "no_healthy")
"""Why a replica was chosen: the balance rule; the key's home replica; its next choice because the
home was over its bound or queueing (spill) or unavailable (failover); by cost, the replica holding
most of the prompt (cache_hit), one holding less where waiting costs less (cache_load), the least
loaded where none holds any (cache_cold); a half-open breaker's trial request; or no replica was
healthy, so the least loaded one was tried anyway."""


@dataclass(frozen=True, slots=True)
class Candidate:
    name: str
    outstanding: int = 0
    """Requests the gateway has on this replica now (running and waiting for its slots)."""
    available: bool = True
    """Its breaker lets a request through and it is not known to be down."""
    saturated: bool = False
    """A request sent now would not start at once (its slots are all busy, or its engine queues)."""
    queueing: bool = False
    """Requests already wait for it: the gateway's queue for it is not empty, or its engine reports
    waiting requests or a full KV cache. Affinity spills only from a queueing replica: one more
    request waiting for a slot where its prefix is cached usually costs less than its whole prefill
    elsewhere."""
    engine_load: float = 0.0
    """Requests its engine reports running and waiting (other clients of a shared upstream included)."""
    probe: bool = False
    """Its breaker is half-open and wants one trial request."""


@dataclass(frozen=True, slots=True)
class Choice:
    index: int
    reason: str


def rank(key: str, names: Sequence[str]) -> list[int]:
    """Indices of `names` in the key's rendezvous order (its home first)."""
    def weight(name: str) -> int:
        digest = hashlib.blake2b(f"{key}\x00{name}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big")

    return sorted(range(len(names)), key=lambda i: weight(names[i]), reverse=True)


def load(candidate: Candidate) -> float:
    """A replica's load: the gateway's own requests there, or its engine's count where that is higher (a
    shared upstream's other clients, among them other gateways in front of it)."""
    return max(float(candidate.outstanding), candidate.engine_load)


def bound(candidates: Sequence[Candidate], usable: Sequence[int], load_factor: float) -> int:
    """The most requests (`load`) one replica may hold before a keyed request spills past it. On the engines'
    own counts where they are higher, so gateways in front of the same replicas bound them alike: on its own
    count alone each saw only its part of the load, and one spilled a conversation from the replica holding
    it while another kept its turns there (issue 38, item 4)."""
    total = sum(load(candidates[i]) for i in usable)
    return max(1, math.ceil(load_factor * (total + 1) / len(usable)))


class Balancer:
    """Holds only the round-robin position; every decision is a function of its arguments."""

    def __init__(self, balance: Balance = "least_outstanding", affinity: Affinity = "none", load_factor: float = 1.25) -> None:
        self.balance = balance
        self.affinity = affinity
        self.load_factor = load_factor
        self._next = 0

    def choose(self, candidates: Sequence[Candidate], key: str | None = None,
               places: Sequence[Place] | None = None) -> Choice | None:
        """None only when there are no candidates at all. `places`: each candidate's cost facts, for
        `affinity: cache` (without them, as for a request with no prompt, the balance rule decides)."""
        if not candidates:
            return None
        usable = [i for i, c in enumerate(candidates) if c.available]
        if not usable:
            return Choice(self._least(candidates, range(len(candidates))), "no_healthy")
        for i in usable:
            if candidates[i].probe:
                return Choice(i, "probe")
        if self.affinity == "cache":
            if places is not None:
                return self._by_cost(candidates, usable, places)
        elif key is not None and self.affinity != "none":
            return self._affine(candidates, usable, key)
        if self.balance == "round_robin":
            return Choice(self._round_robin(len(candidates), usable), "round_robin")
        return Choice(self._least(candidates, usable), "least_outstanding")

    def _affine(self, candidates: Sequence[Candidate], usable: list[int], key: str) -> Choice:
        order = rank(key, [c.name for c in candidates])
        home = order[0]
        cap = bound(candidates, usable, self.load_factor)
        calm = any(not candidates[i].queueing for i in usable)
        for i in order:
            c = candidates[i]
            if not c.available or load(c) >= cap or (calm and c.queueing):
                continue
            if i == home:
                return Choice(i, "affinity")
            return Choice(i, "affinity_failover" if not candidates[home].available else "affinity_spill")
        return Choice(self._least(candidates, usable), "affinity_spill")

    def _by_cost(self, candidates: Sequence[Candidate], usable: list[int], places: Sequence[Place]) -> Choice:
        cap = bound(candidates, usable, self.load_factor)
        within = [i for i in usable if load(candidates[i]) < cap] or usable
        n = len(candidates)
        start = self._next
        self._next = (self._next + 1) % n
        index, reason = cheapest(places, sorted(within, key=lambda i: (i - start) % n), usable)
        return Choice(index, reason)

    def _least(self, candidates: Sequence[Candidate], among: Sequence[int]) -> int:
        """Fewest outstanding (the engine's own count where it is higher); ties rotate so idle replicas share."""
        n = len(candidates)
        start = self._next
        self._next = (self._next + 1) % n

        def order(i: int) -> tuple[bool, float, int]:
            c = candidates[i]
            return (c.saturated, load(c), (i - start) % n)

        return min(among, key=order)

    def _round_robin(self, n: int, usable: list[int]) -> int:
        for step in range(n):
            i = (self._next + step) % n
            if i in usable:
                self._next = (i + 1) % n
                return i
        return usable[0]
