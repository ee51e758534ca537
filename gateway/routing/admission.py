"""Per-replica admission: the engine's concurrent generations and the scheduler that orders the wait.

Concurrency rule: `acquire()`/`release()`/`prefilled()`/`resize()` run on the event loop only.
A request starts at once when a slot is free and the scheduler lets it (gateway/scheduling:
tiers, flows, newcomer slots, prefill budget); otherwise it waits in the replica's `FairQueue`,
which decides who goes next and whom a full queue refuses (`Refused`, a `QueueFull`: the API
answers 429 with Retry-After). A waiter whose deadline passes leaves with `DeadlineExceeded`
(504); one whose client gives up (its task is cancelled) leaves at once. `concurrency=None` is
no gateway cap at all (an external URL that queues on its own); `resize()` follows the capacity
the engine reports after it started (llama-server's slots).

Preemption (`preempts`): a preemptible stream may take a slot kept for newcomers while no waiter of
another flow could have it; when such a waiter arrives, the newest borrower is marked `preempted` and
its slot goes to the arrival at once. The borrower's stream sees the mark at its next event, closes its
engine request and asks for a slot again as `resumed` (gateway/api/resume.py); its release then counts
nothing, since the slot was handed over when it was marked.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from gateway.config import SchedulerConfig
from gateway.identity import ServiceTier
from gateway.scheduling import (RANK, Block, Demand, FairQueue, FlowWindow, Occupancy, Refused, Waiter, blocked,
                                borrows, may_preempt_for)
from gateway.scheduling.slots import kept_from


class QueueFull(Exception):
    pass


class Refusal(QueueFull):
    """The scheduler refused the request (or displaced it from the queue); `reason` names the rule."""

    def __init__(self, refused: Refused) -> None:
        super().__init__(str(refused))
        self.reason = refused.reason


class DeadlineExceeded(Exception):
    """The request's deadline passed while it waited for a slot."""


@dataclass(eq=False, slots=True)
class Ticket:
    """One admitted request's hold on a slot (what `release` and `prefilled` are given)."""

    demand: Demand = field(default_factory=Demand)
    prefilling: bool = False
    waited: float = 0.0
    """Seconds it spent in the queue."""
    produced: bool = False
    """Its first token came."""
    preempted: bool = False
    """Its slot was handed to a newcomer: its stream stops at its next event and asks again (resumed)."""


class Admission:
    def __init__(self, concurrency: int | None = 1, max_queue: int = 16, policy: SchedulerConfig | None = None,
                 preempts: bool = False) -> None:
        self.concurrency = concurrency
        self.max_queue = max_queue
        self.policy = policy or SchedulerConfig()
        self.running = 0
        self.prefill_tokens = 0
        self._running_by_flow: collections.Counter[str] = collections.Counter()
        self._recent = FlowWindow(self.policy.flow_window_seconds)
        """Flows that used this replica lately (loop time): newcomer slots are kept only when several did."""
        self.preempts = preempts and self.fair and bool(self.policy.newcomer_slots)
        """Preemptible streams borrow kept slots and give them back to newcomers (see the module's docstring)."""
        self.preemptions = 0
        self._borrowers: dict[Ticket, None] = {}
        """Running tickets that may be cut (preemptible, not yet resumed), oldest start first."""
        self._recheck: asyncio.TimerHandle | None = None
        """Re-evaluates the queue when the oldest flow leaves the window (a kept slot may be free to hand out)."""
        fair = self.fair  # under fifo every request is one flow of one tier: no per-flow bound, no aging
        self._queue = FairQueue(max_queue, self.policy.max_queue_per_flow if fair else None,
                                self.policy.aging_seconds if fair else None,
                                self.policy.prefill_budget_tokens if fair else None)

    @property
    def fair(self) -> bool:
        return self.policy.policy == "fair"

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def waiting_by_tier(self) -> dict[ServiceTier, int]:
        return self._queue.waiting_by_tier()

    @property
    def free(self) -> bool:
        """A request arriving now would start at once (a newcomer; a busy flow may find its slots reserved)."""
        return self.concurrency is None or (self.running < self.concurrency and not self._queue)

    @property
    def full(self) -> bool:
        """The queue is at its bound (an arrival displaces a waiter or is refused)."""
        return not self.free and self.waiting >= self.max_queue

    def can_start(self, demand: Demand) -> bool:
        """A slot is free for this request now: the replica's cap, the newcomer slots, the prefill budget."""
        return self._blocked(demand) is None

    def _blocked(self, demand: Demand) -> Block | None:
        borrow = self.preempts and demand.preemptible
        at = Occupancy(self.concurrency, self.running, self._running_by_flow[demand.flow], self.prefill_tokens,
                       len(self._recent), borrow)
        why = blocked(demand, at, self.policy)
        if why is None and borrow and kept_from(at, self.policy.newcomer_slots) and self._contested(demand.flow):
            return "kept"  # another flow's waiter may have the kept slot: nobody borrows it from under it
        return why

    def _contested(self, flow: str) -> bool:
        """A waiter of another flow that the kept rule lets start (a flow below its share) is waiting."""
        kept, recent = self.policy.newcomer_slots, len(self._recent)
        return any(not kept_from(Occupancy(self.concurrency, self.running, self._running_by_flow[f], 0, recent), kept)
                   for f in self._queue.waiting_flows() if f != flow)

    async def acquire(self, demand: Demand | None = None) -> Ticket:
        loop = asyncio.get_running_loop()
        ticket = Ticket(self._keyed(demand or Demand()))
        now = loop.time()
        self._used(ticket.demand.flow, now)
        if ticket.demand.deadline is not None and ticket.demand.deadline <= now:
            raise DeadlineExceeded("the request's deadline passed before it could be admitted")
        if not self._queue and self.can_start(ticket.demand):
            self._start(ticket)
            return ticket
        future: asyncio.Future[None] = loop.create_future()
        try:
            waiter, displaced = self._queue.push(ticket.demand, now, (future, ticket))
        except Refused as exc:
            raise Refusal(exc) from None
        if displaced is not None:
            self._refuse(displaced, Refused(self._queue.reason_displaced(displaced, ticket.demand),
                                            "a request of a higher class or a less busy client took its place in the queue"))
        deadline = ticket.demand.deadline
        timer = loop.call_at(deadline, self._expire, waiter) if deadline is not None else None
        self._wake()
        if self.preempts and not future.done():
            self._preempt_for(waiter)
        try:
            await future  # _wake counts us as running before it wakes us
        except BaseException:
            if future.done() and not future.cancelled() and future.exception() is None:
                self.release(ticket)  # woken and cancelled at once: hand the slot on
            else:
                self._queue.remove(waiter)
            raise
        finally:
            if timer is not None:
                timer.cancel()
        ticket.waited = loop.time() - now
        return ticket

    def release(self, ticket: Ticket | None = None) -> None:
        ticket = ticket or Ticket(self._keyed(Demand()))
        if ticket.preempted:
            return  # its slot went to the newcomer it was preempted for
        self._stop(ticket)
        self._used(ticket.demand.flow, asyncio.get_running_loop().time())  # its window runs from its last request's end
        self._wake()

    def prefilled(self, ticket: Ticket) -> None:
        """The request's first token came: its prompt no longer counts against the prefill budget."""
        ticket.produced = True
        if ticket.prefilling:
            self._end_prefill(ticket)
            self._wake()

    def pin(self, ticket: Ticket) -> None:
        """The ticket's stream cannot be resumed any more: it is no longer a candidate for preemption."""
        self._borrowers.pop(ticket, None)

    def resize(self, concurrency: int | None) -> None:
        self.concurrency = concurrency
        self._wake()

    def _used(self, flow: str, now: float) -> None:
        """Note the flow's arrival or end; the window's other flows that lapsed leave it."""
        if self.fair and self.policy.newcomer_slots:
            self._recent.touch(flow, now)

    def _lapse(self) -> None:
        """The oldest flow's window ended: a slot kept for it may now go to a waiter."""
        self._recheck = None
        self._recent.prune(asyncio.get_running_loop().time())
        self._wake()

    def _keyed(self, demand: Demand) -> Demand:
        """Under fifo every request is one flow of one tier (its deadline still holds)."""
        return demand if self.fair else Demand(prompt_tokens=demand.prompt_tokens, deadline=demand.deadline)

    def _start(self, ticket: Ticket) -> None:
        self.running += 1
        self._running_by_flow[ticket.demand.flow] += 1
        if self.preempts and ticket.demand.preemptible and not ticket.demand.resumed:
            self._borrowers[ticket] = None  # a stream is cut at most once: resumed, it may borrow but stays
        if ticket.demand.prompt_tokens:
            ticket.prefilling = True
            self.prefill_tokens += ticket.demand.prompt_tokens

    def _stop(self, ticket: Ticket) -> None:
        """It no longer holds its slot (it ended, or it was preempted)."""
        self._borrowers.pop(ticket, None)
        self.running -= 1
        flow = ticket.demand.flow
        self._running_by_flow[flow] -= 1
        if self._running_by_flow[flow] <= 0:
            del self._running_by_flow[flow]
        self._end_prefill(ticket)

    def _end_prefill(self, ticket: Ticket) -> None:
        if ticket.prefilling:
            ticket.prefilling = False
            self.prefill_tokens -= ticket.demand.prompt_tokens

    def _wake(self) -> None:
        now = asyncio.get_running_loop().time() if self._queue else 0.0
        while self._queue:
            waiter = self._queue.pop(now, self._blocked)
            if waiter is None:
                break
            future, ticket = _parts(waiter)
            if not future.done():
                self._start(ticket)
                future.set_result(None)
        self._arm()

    def _preempt_for(self, waiter: Waiter) -> None:
        """Hand `waiter` a slot borrowed by another flow's stream of its tier or a lower one, when the kept rule
        would let it have one: the newest borrower that has produced a token (else the newest), of the flow
        running most per weight."""
        demand = waiter.demand
        kept, recent = self.policy.newcomer_slots, len(self._recent)
        if not may_preempt_for(Occupancy(self.concurrency, self.running, self._running_by_flow[demand.flow], 0,
                                         recent), kept):
            return
        rank = RANK[demand.tier]
        candidates = [t for t in self._borrowers if t.demand.flow != demand.flow and RANK[t.demand.tier] >= rank
                      and borrows(Occupancy(self.concurrency, self.running, self._running_by_flow[t.demand.flow], 0,
                                            recent), kept)]
        if not candidates:
            return
        victim = max(reversed(candidates), key=lambda t: (
            self._running_by_flow[t.demand.flow] / t.demand.weight, t.produced))
        freed = victim.demand.prompt_tokens if victim.prefilling else 0
        at = Occupancy(self.concurrency, self.running - 1, self._running_by_flow[demand.flow],
                       self.prefill_tokens - freed, recent)
        if blocked(demand, at, self.policy) is not None:
            return  # the prefill budget holds it even with the slot
        self._stop(victim)
        victim.preempted = True
        self.preemptions += 1
        future, ticket = _parts(waiter)
        self._queue.remove(waiter)
        self._start(ticket)
        future.set_result(None)

    def _arm(self) -> None:
        """While requests wait and several flows share the window, re-evaluate when the oldest leaves it:
        slots kept for a flow that has left are handed out then, not when something new next arrives."""
        if self._recheck is not None or not self._queue or len(self._recent) < 2:
            return
        expires = self._recent.expires()
        if expires is not None:
            self._recheck = asyncio.get_running_loop().call_at(expires, self._lapse)

    def _expire(self, waiter: Waiter) -> None:
        if self._queue.remove(waiter):
            future, _ = _parts(waiter)
            if not future.done():
                future.set_exception(DeadlineExceeded("the request's deadline passed while it waited for a slot"))
            self._wake()

    def _refuse(self, waiter: Waiter, refused: Refused) -> None:
        future, _ = _parts(waiter)
        if not future.done():
            future.set_exception(Refusal(refused))

    @asynccontextmanager
    async def slot(self, demand: Demand | None = None) -> AsyncIterator[Ticket]:
        ticket = await self.acquire(demand)
        try:
            yield ticket
        finally:
            self.release(ticket)


def _parts(waiter: Waiter) -> tuple[asyncio.Future[None], Ticket]:
    future, ticket = waiter.token  # type: ignore[misc]
    return future, ticket
