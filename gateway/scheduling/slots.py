"""Whether a request may start on a replica now, and if not why: its slots, the slots kept for
newcomers, the prefill budget. Pure: gateway/routing/admission.py passes the replica's state.

Also the window of recent flows the kept slots are for (`FlowWindow`): pure too, the caller passes
the time and re-evaluates at `expires()`, so a kept slot is handed out when the last other flow's
window ends, not only when something new arrives."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from gateway.config import SchedulerConfig
from gateway.scheduling.demand import Demand

Block = Literal["slots", "kept", "budget"]
"""Why a request cannot start now: every slot busy; the free ones are kept for flows below their share;
its prompt does not fit beside the prompts being prefilled."""


@dataclass(frozen=True, slots=True)
class Occupancy:
    """A replica's state as the start rule reads it."""

    concurrency: int | None
    """Its slots; None: no gateway cap."""
    running: int = 0
    running_of_flow: int = 0
    """The requests of the candidate's flow running there."""
    prefill_tokens: int = 0
    """Prompt tokens admitted whose first token has not come."""
    recent_flows: int = 1
    """Flows that used the replica within the window (the kept slots exist when more than one did)."""
    preempts: bool = False
    """The replica takes a kept slot back from a preemptible stream that borrowed it (`scheduler.preempt`)."""


def blocked(demand: Demand, at: Occupancy, policy: SchedulerConfig) -> Block | None:
    """None when `demand` may start now. Under `fifo` only the slots count."""
    if at.concurrency is None:
        return None
    if at.running >= at.concurrency:
        return "slots"
    if policy.policy != "fair":
        return None
    if kept_from(at, policy.newcomer_slots) and not (at.preempts and demand.preemptible):
        return "kept"  # a preemptible stream borrows the kept slot: preempted when a newcomer comes
    budget = policy.prefill_budget_tokens
    if budget and at.prefill_tokens > 0 and at.prefill_tokens + demand.prompt_tokens > budget:
        return "budget"  # one alone always starts, whatever its length
    return None


def kept_from(at: Occupancy, kept: int) -> bool:
    """Whether the candidate's flow is held off the replica's last `kept` free slots: they are for flows
    below their share (slots / flows that used the replica lately; a newcomer has none running), kept
    while more than one flow did, on any replica of two slots or more, and never the flow's first slot
    (one client alone, or below its share, keeps every slot it can use). On two slots that is one slot
    each: a flood holds one, the other stays free for its neighbour's next request."""
    if not kept or at.recent_flows < 2 or at.concurrency is None or at.concurrency < 2:
        return False
    return at.running >= at.concurrency - kept and at.running_of_flow >= max(1.0, at.concurrency / at.recent_flows)


def borrows(at: Occupancy, kept: int) -> bool:
    """Whether one of the running requests of a flow (`at.running_of_flow` of them) holds a slot the kept
    rule would have refused it: without that request, the flow would still be held off the last slot."""
    if at.running_of_flow < 1:
        return False
    return kept_from(Occupancy(at.concurrency, at.running - 1, at.running_of_flow - 1, 0, at.recent_flows), kept)


def may_preempt_for(at: Occupancy, kept: int) -> bool:
    """Whether a waiting flow (`at.running_of_flow` running) may have a borrowed slot back: with one request
    fewer running, the kept rule would let it start."""
    return not kept_from(Occupancy(at.concurrency, at.running - 1, at.running_of_flow, 0, at.recent_flows), kept)


@dataclass(slots=True)
class FlowWindow:
    """Flows that used a replica within `seconds` (an arrival or an end), oldest first."""

    seconds: float
    _last: dict[str, float] = field(default_factory=dict)

    def touch(self, flow: str, now: float) -> None:
        self._last.pop(flow, None)
        self._last[flow] = now  # insertion order is the order of last use: the oldest first
        self.prune(now)

    def prune(self, now: float) -> None:
        horizon = now - self.seconds
        while self._last and next(iter(self._last.values())) <= horizon:
            del self._last[next(iter(self._last))]

    def __len__(self) -> int:
        return len(self._last)

    def expires(self) -> float | None:
        """When the oldest flow leaves the window (the count may drop then); None when empty."""
        return next(iter(self._last.values())) + self.seconds if self._last else None
