"""Who waits and who goes next: strict priority between service tiers, with aging, and weighted
fair queuing between flows inside each tier.

Pure: the caller passes the time and a predicate saying whether a request could start now; it
owns the futures and timers (gateway/routing/admission.py).

- Within a tier, start-time fair queuing (Goyal, Vin, Cheng 1996): each flow's requests are
  tagged with virtual finish times `start + 1/weight`, where `start` is the later of the tier's
  virtual time and the flow's last finish; the waiter with the smallest tag among the flows'
  first waiters goes next. A flow that sends 40 at once gets tags 1..40; a flow arriving later
  gets the tier's current virtual time + 1, so it goes next, and over time each backlogged flow
  starts requests in proportion to its weight. Each flow is first in, first out.
- Between tiers, strict priority, except that a tier whose oldest first waiter has waited
  `aging_seconds` goes before every tier that has not (oldest first): the lowest tier's wait is
  bounded. Inside a tier aging changes nothing: the fair order holds (before, an aged waiter went
  before every other, so a flood's backlog older than `aging_seconds` went before a neighbour's
  request that had just arrived: first come, first served again, issue 38).
- The prefill budget (gateway/scheduling/slots.py) holds back a prompt that does not fit beside those
  being prefilled while shorter ones start, but not for ever: a waiter held back only by it lets later
  waiters (in this order) start past it until their prompt tokens add up to `overtake_tokens` (the
  budget; each counts at least 1), then it holds the next start: nobody behind it starts until it has,
  so the prefill under way drains and it starts. Its flow's later requests wait behind it (each flow is
  first in, first out); other flows wait at most for that drain and its own prefill.
- Bounds: a flow may hold `max_per_flow` waiters (then `flow_bound`). When the whole queue is
  full, the arrival displaces the newest `flex` waiter if it is not flex itself (`class`), else
  the newest waiter of the flow holding the most waiters per unit of weight, if that flow holds
  more than the arrival's flow would (`flow_share`); otherwise the arrival is refused
  (`queue_full`). So a burst is refused to its sender, never to someone else.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from gateway.identity import ServiceTier
from gateway.scheduling.demand import RANK, TIERS, Demand
from gateway.scheduling.slots import Block

RefusalReason = Literal["flow_bound", "flow_share", "class", "queue_full", "deadline"]
REFUSAL_REASONS: tuple[RefusalReason, ...] = ("flow_bound", "flow_share", "class", "queue_full", "deadline")
"""Why a request was refused or left the queue unserved (a bounded metric label)."""


class Refused(Exception):
    def __init__(self, reason: RefusalReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(eq=False, slots=True)
class Waiter:
    demand: Demand
    arrived: float
    seq: int
    finish: float
    """Its virtual finish tag in its tier."""
    token: object = None
    """What the caller attached (its future)."""
    overtaken: int = 0
    """Prompt tokens of later waiters that started past it while the prefill budget held it back."""

    @property
    def start(self) -> float:
        return self.finish - 1.0 / self.demand.weight


@dataclass(slots=True)
class _Tier:
    virtual: float = 0.0
    flows: dict[str, collections.deque[Waiter]] = field(default_factory=dict)
    last_finish: dict[str, float] = field(default_factory=dict)

    def heads(self) -> Iterator[Waiter]:
        return (q[0] for q in self.flows.values())


class FairQueue:
    def __init__(self, max_queue: int, max_per_flow: int | None = None, aging_seconds: float | None = 10.0,
                 overtake_tokens: int | None = None) -> None:
        self.max_queue = max_queue
        self.max_per_flow = max_per_flow
        self.aging_seconds = aging_seconds
        self.overtake_tokens = overtake_tokens
        """How many prompt tokens may start past a waiter the prefill budget holds back; None: no bound."""
        self._tiers: dict[ServiceTier, _Tier] = {tier: _Tier() for tier in TIERS}
        self._per_flow: collections.Counter[str] = collections.Counter()
        self._size = 0
        self._seq = itertools.count()

    def __len__(self) -> int:
        return self._size

    def waiting_by_tier(self) -> dict[ServiceTier, int]:
        return {tier: sum(len(q) for q in t.flows.values()) for tier, t in self._tiers.items()}

    def waiting_of(self, flow: str) -> int:
        return self._per_flow[flow]

    def waiting_flows(self) -> collections.abc.KeysView[str]:
        return self._per_flow.keys()

    @property
    def flows(self) -> int:
        """Flows with at least one waiter."""
        return len(self._per_flow)

    def push(self, demand: Demand, now: float, token: object = None) -> tuple[Waiter, Waiter | None]:
        """Queue `demand`; returns its waiter and the waiter it displaced (the caller refuses that one),
        or raises Refused. A resumed stream (`demand.resumed`) goes first in its flow, past every bound."""
        if demand.resumed:
            return self._push_first(demand, now, token), None
        if self.max_per_flow is not None and self._per_flow[demand.flow] >= self.max_per_flow:
            raise Refused("flow_bound", f"this client already has {self.max_per_flow} requests waiting "
                                        f"(the per-client queue bound)")
        displaced = None
        if self._size >= self.max_queue:
            displaced = self._victim(demand)
            if displaced is None:
                raise Refused("queue_full", f"{self._size} requests waiting (queue limit {self.max_queue})")
            self.remove(displaced)
        tier = self._tiers[demand.tier]
        start = max(tier.virtual, tier.last_finish.get(demand.flow, 0.0))
        waiter = Waiter(demand, now, next(self._seq), start + 1.0 / demand.weight, token)
        tier.last_finish[demand.flow] = waiter.finish
        tier.flows.setdefault(demand.flow, collections.deque()).append(waiter)
        self._per_flow[demand.flow] += 1
        self._size += 1
        return waiter, displaced

    def _push_first(self, demand: Demand, now: float, token: object) -> Waiter:
        """A preempted stream was admitted once: it goes on before its flow's waiters, with the tag of the
        flow's head (or the next tag when none waits), and no bound refuses it."""
        tier = self._tiers[demand.tier]
        queue = tier.flows.setdefault(demand.flow, collections.deque())
        if queue:
            finish = queue[0].finish
        else:
            finish = max(tier.virtual, tier.last_finish.get(demand.flow, 0.0)) + 1.0 / demand.weight
            tier.last_finish[demand.flow] = finish
        waiter = Waiter(demand, now, next(self._seq), finish, token)
        queue.appendleft(waiter)
        self._per_flow[demand.flow] += 1
        self._size += 1
        return waiter

    def reason_displaced(self, displaced: Waiter, arrival: Demand) -> RefusalReason:
        return "class" if RANK[displaced.demand.tier] > RANK[arrival.tier] else "flow_share"

    def _victim(self, arrival: Demand) -> Waiter | None:
        flex = self._tiers["flex"]
        if arrival.tier != "flex" and flex.flows:
            newest = self._newest_of_longest(flex.flows.values())
            if not newest.demand.resumed:  # only a flow's first waiter can be a resumed stream: never displaced
                return newest
        arriving = (self._per_flow[arrival.flow] + 1) / arrival.weight
        # the most-waiting flow among those in the arrival's tier or below (a burst never displaces a higher class)
        queues = [q for tier in TIERS[RANK[arrival.tier]:] for q in self._tiers[tier].flows.values()]
        if not queues:
            return None
        victim = self._newest_of_longest(queues)
        if victim.demand.resumed:
            return None
        if self._per_flow[victim.demand.flow] / victim.demand.weight > arriving:
            return victim
        return None

    def _newest_of_longest(self, queues: collections.abc.Iterable[collections.deque[Waiter]]) -> Waiter:
        longest = max(queues, key=lambda q: (self._per_flow[q[0].demand.flow] / q[0].demand.weight, q[-1].seq))
        return longest[-1]

    def remove(self, waiter: Waiter) -> bool:
        """Take a waiter out (served elsewhere, cancelled, expired or displaced); False if it was not here."""
        tier = self._tiers[waiter.demand.tier]
        queue = tier.flows.get(waiter.demand.flow)
        if queue is None or waiter not in queue:
            return False
        if queue[-1] is waiter:  # the flow's newest: give its virtual time back
            tier.last_finish[waiter.demand.flow] = waiter.start
        queue.remove(waiter)
        self._forget(tier, waiter.demand.flow, queue)
        return True

    def order(self, now: float) -> list[Waiter]:
        """The flows' first waiters in the order they would be served now: tier by tier (a tier whose
        oldest first waiter has waited `aging_seconds` before every tier that has not, oldest first), and
        inside a tier by virtual finish tag. Aging lifts a tier over higher ones, never one flow over
        another: a flood's backlog that has waited long does not go before a neighbour that just came."""
        aging = self.aging_seconds
        ranked: list[tuple[tuple[int, float, int], list[Waiter]]] = []
        for rank, tier in enumerate(self._tiers.values()):
            heads = sorted(tier.heads(), key=lambda w: (w.finish, w.arrived, w.seq))
            if not heads:
                continue
            oldest = min(w.arrived for w in heads)
            aged = aging is not None and now - oldest >= aging
            ranked.append(((0, oldest, rank) if aged else (1, float(rank), rank), heads))
        ranked.sort(key=lambda t: t[0])
        return [w for _, heads in ranked for w in heads]

    def pop(self, now: float, blocked: Callable[[Demand], Block | None] = lambda d: None) -> Waiter | None:
        """The next waiter, in `order`, that may start (`blocked` answers None for it); None when none may,
        or when a waiter ahead that only the prefill budget holds back has been overtaken enough (it holds
        the next start)."""
        held: list[Waiter] = []
        for waiter in self.order(now):
            why = blocked(waiter.demand)
            if why == "budget":
                if self.overtake_tokens is not None and waiter.overtaken >= self.overtake_tokens:
                    return None
                held.append(waiter)
                continue
            if why is not None:
                continue
            for passed in held:
                passed.overtaken += max(1, waiter.demand.prompt_tokens)
            tier = self._tiers[waiter.demand.tier]
            queue = tier.flows[waiter.demand.flow]
            queue.popleft()
            tier.virtual = max(tier.virtual, waiter.start)
            self._forget(tier, waiter.demand.flow, queue)
            if len(tier.last_finish) > 2 * len(tier.flows) + 64:  # idle flows' spent tags: bounded memory
                tier.last_finish = {f: t for f, t in tier.last_finish.items() if f in tier.flows or t > tier.virtual}
            return waiter
        return None

    def _forget(self, tier: _Tier, flow: str, queue: collections.deque[Waiter]) -> None:
        self._size -= 1
        self._per_flow[flow] -= 1
        if self._per_flow[flow] <= 0:
            del self._per_flow[flow]
        if not queue:
            del tier.flows[flow]
            if tier.last_finish.get(flow, 0.0) <= tier.virtual:
                tier.last_finish.pop(flow, None)  # its tags are spent: nothing to remember

    def __iter__(self) -> Iterator[Waiter]:
        for tier in self._tiers.values():
            for queue in tier.flows.values():
                yield from queue
