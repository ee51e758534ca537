"""Preemption in admission: a preemptible flood borrows the kept slot and gives it back to a newcomer at once."""

from __future__ import annotations

import asyncio

import pytest

from gateway.config import SchedulerConfig
from gateway.routing import Admission, Refusal, Ticket
from gateway.scheduling import Demand, Occupancy, borrows, may_preempt_for

A = Demand(flow="a", preemptible=True)
B = Demand(flow="b", preemptible=True)


async def at_once(adm: Admission, demand: Demand) -> Ticket:
    """The ticket, which must come without waiting for anything else to happen."""
    task = asyncio.create_task(adm.acquire(demand))
    await asyncio.sleep(0)
    assert task.done(), "it waits"
    return task.result()


async def shared(adm: Admission) -> None:
    """b used the replica lately: a slot is kept for it."""
    adm.release(await adm.acquire(Demand(flow="b")))


async def test_a_preemptible_flood_takes_the_kept_slot_and_gives_it_back_to_a_newcomer() -> None:
    adm = Admission(concurrency=2, max_queue=16, preempts=True)
    await shared(adm)
    first, second = await adm.acquire(A), await adm.acquire(A)  # both slots: the second borrows the kept one
    assert adm.running == 2 and not first.preempted
    third = asyncio.create_task(adm.acquire(A))
    await asyncio.sleep(0)
    assert adm.waiting == 1  # a third finds no slot

    newcomer = await at_once(adm, B)  # the borrower's slot is handed over  # at once: the borrower's slot is handed over
    assert second.preempted and not first.preempted  # the newest borrower
    assert (adm.running, adm.waiting, adm.preemptions) == (2, 1, 1)
    adm.release(second)  # its stream stops: counts nothing, the slot is the newcomer's
    assert (adm.running, adm.waiting) == (2, 1)
    adm.release(newcomer)
    await asyncio.sleep(0)
    assert third.done() and adm.running == 2


async def test_without_preemption_the_kept_slot_stays_free() -> None:
    for preempts, demand in ((False, A), (True, Demand(flow="a"))):  # off, or a stream that cannot be resumed
        adm = Admission(concurrency=2, max_queue=16, preempts=preempts)
        await shared(adm)
        await adm.acquire(demand)
        blocked = asyncio.create_task(adm.acquire(demand))
        await asyncio.sleep(0)
        assert (adm.running, adm.waiting) == (1, 1)
        newcomer = await at_once(adm, B)
        assert adm.preemptions == 0 and not newcomer.preempted
        blocked.cancel()


async def test_a_newcomer_never_preempts_a_higher_tier() -> None:
    adm = Admission(concurrency=2, max_queue=16, preempts=True)
    await shared(adm)
    high = Demand(flow="a", tier="priority", preemptible=True)
    first, second = await adm.acquire(high), await adm.acquire(high)
    flex = asyncio.create_task(adm.acquire(Demand(flow="b", tier="flex")))
    await asyncio.sleep(0)
    assert not flex.done() and not second.preempted  # a flex newcomer waits
    newcomer = await at_once(adm, Demand(flow="c", tier="priority"))  # one of the same tier does not
    assert second.preempted and not newcomer.preempted
    flex.cancel()


async def test_preemption_needs_the_kept_rule_on() -> None:
    for policy in (SchedulerConfig(newcomer_slots=0), SchedulerConfig(policy="fifo")):
        assert not Admission(2, 16, policy, preempts=True).preempts


async def test_the_victim_is_one_that_has_produced_a_token_and_no_flow_goes_below_its_share() -> None:
    adm = Admission(concurrency=4, max_queue=16, preempts=True)
    await shared(adm)
    tickets = [await adm.acquire(A) for _ in range(4)]
    for t in tickets[:2]:
        adm.prefilled(t)  # the two oldest have streamed; the two newest still prefill
    got = [await at_once(adm, B) for _ in range(2)]  # b's share of 4 slots among 2 flows
    assert [t.preempted for t in tickets] == [True, True, False, False]  # those that streamed, not the prefilling
    assert adm.preemptions == 2 and all(not g.preempted for g in got)
    third_b = asyncio.create_task(adm.acquire(B))  # past b's share: waits, a keeps its two
    await asyncio.sleep(0)
    assert adm.preemptions == 2 and adm.waiting == 1
    third_b.cancel()


async def test_a_resumed_stream_may_borrow_again_but_is_never_cut_again() -> None:
    adm = Admission(concurrency=2, max_queue=16, preempts=True)
    await shared(adm)
    again = Demand(flow="a", preemptible=True, resumed=True)
    first = await adm.acquire(again)
    second = await at_once(adm, again)  # the kept slot, borrowed
    waiting = asyncio.create_task(adm.acquire(B))
    await asyncio.sleep(0)
    assert not waiting.done() and not second.preempted and adm.preemptions == 0  # b waits for a slot
    adm.release(first)
    await asyncio.sleep(0)
    assert waiting.done()
    adm.release(waiting.result())
    fresh = await at_once(adm, A)  # b's request ended: a fresh stream of a's borrows the slot...
    await at_once(adm, B)
    assert fresh.preempted and not second.preempted  # ...and is the one cut


async def test_a_pinned_stream_is_never_preempted() -> None:
    adm = Admission(concurrency=2, max_queue=16, preempts=True)
    await shared(adm)
    first, second = await adm.acquire(A), await adm.acquire(A)
    adm.pin(first)
    adm.pin(second)  # e.g. it began a tool call: a resume could not carry it on
    waiting = asyncio.create_task(adm.acquire(B))
    await asyncio.sleep(0)
    assert adm.waiting == 1 and not waiting.done() and adm.preemptions == 0
    adm.release(first)
    await asyncio.sleep(0)
    assert waiting.done()


async def test_a_waiting_newcomer_keeps_the_flood_from_borrowing_a_freed_slot() -> None:
    adm = Admission(concurrency=2, max_queue=16, preempts=True)
    await shared(adm)
    first, second = await adm.acquire(A), await adm.acquire(A)
    adm.pin(first)
    adm.pin(second)
    flood = asyncio.create_task(adm.acquire(A))
    await asyncio.sleep(0)
    newcomer = asyncio.create_task(adm.acquire(B))
    await asyncio.sleep(0)
    adm.release(first)  # a's waiter is ahead in fair order, but b may have the slot: a may only borrow it
    await asyncio.sleep(0)
    assert newcomer.done() and not flood.done()
    flood.cancel()


async def test_a_resumed_stream_goes_first_in_its_flow_past_every_bound() -> None:
    adm = Admission(concurrency=1, max_queue=1, policy=SchedulerConfig(max_queue_per_flow=1), preempts=True)
    holder = await adm.acquire(Demand(flow="c"))
    queued = asyncio.create_task(adm.acquire(Demand(flow="a")))
    await asyncio.sleep(0)
    with pytest.raises(Refusal):
        await adm.acquire(Demand(flow="a"))  # a's own bound, and the queue's
    resumed = asyncio.create_task(adm.acquire(Demand(flow="a", resumed=True)))
    await asyncio.sleep(0)
    assert adm.waiting == 2  # past both bounds
    adm.release(holder)
    await asyncio.sleep(0)
    assert resumed.done() and not queued.done()  # first of its flow
    queued.cancel()


async def test_a_resumed_stream_is_never_displaced() -> None:
    adm = Admission(concurrency=1, max_queue=1, preempts=True)
    holder = await adm.acquire(Demand(flow="c"))
    resumed = asyncio.create_task(adm.acquire(Demand(flow="a", resumed=True, tier="flex")))
    await asyncio.sleep(0)
    for arrival in (Demand(flow="d"), Demand(flow="d", tier="priority")):  # by share, by class
        with pytest.raises(Refusal):
            await adm.acquire(arrival)
    adm.release(holder)
    await asyncio.sleep(0)
    assert resumed.done()


@pytest.mark.parametrize(("at", "borrower"), [
    (Occupancy(2, 2, 2, 0, 2), True),    # a flood on 2 slots beside a recent neighbour: one is borrowed
    (Occupancy(2, 2, 2, 0, 1), False),   # alone: both are its own
    (Occupancy(2, 2, 1, 0, 2), False),   # its share
    (Occupancy(4, 4, 3, 0, 2), True),
    (Occupancy(4, 4, 2, 0, 2), False),
    (Occupancy(1, 1, 1, 0, 2), False),   # one slot: nothing is kept
])
def test_borrows(at: Occupancy, borrower: bool) -> None:
    assert borrows(at, 1) is borrower


@pytest.mark.parametrize(("at", "may"), [
    (Occupancy(2, 2, 0, 0, 2), True),    # a newcomer with nothing running
    (Occupancy(2, 2, 1, 0, 2), False),   # it has its share
    (Occupancy(4, 4, 1, 0, 2), True),    # below its share of 2
    (Occupancy(4, 4, 2, 0, 2), False),
])
def test_may_preempt_for(at: Occupancy, may: bool) -> None:
    assert may_preempt_for(at, 1) is may


def test_ticket_defaults() -> None:
    ticket = Ticket()
    assert not ticket.preempted and not ticket.produced
