from __future__ import annotations

import asyncio

import pytest

from gateway.routing import Admission, QueueFull


async def test_waits_in_order_then_refuses_past_the_queue() -> None:
    adm = Admission(concurrency=1, max_queue=2)
    await adm.acquire()
    order: list[int] = []

    async def waiter(i: int) -> None:
        async with adm.slot():
            order.append(i)

    tasks = [asyncio.create_task(waiter(i)) for i in range(2)]
    await asyncio.sleep(0)
    assert adm.waiting == 2
    with pytest.raises(QueueFull):
        await adm.acquire()
    adm.release()
    await asyncio.gather(*tasks)
    assert order == [0, 1]
    assert (adm.running, adm.waiting) == (0, 0)


async def test_cancelled_waiter_leaves_the_queue() -> None:
    adm = Admission(concurrency=1, max_queue=1)
    await adm.acquire()
    t = asyncio.create_task(adm.acquire())
    await asyncio.sleep(0)
    assert adm.waiting == 1
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t
    assert adm.waiting == 0
    adm.release()
    await adm.acquire()  # the slot is usable again
    assert adm.running == 1


# the scheduler behind acquire (gateway/scheduling): flows, newcomer slots, prefill budget, deadlines

from gateway.config import SchedulerConfig  # noqa: E402
from gateway.routing import DeadlineExceeded, Refusal, Ticket  # noqa: E402
from gateway.scheduling import Demand  # noqa: E402


async def started(adm: Admission, demands: list[Demand]) -> list[asyncio.Task[Ticket]]:
    tasks = [asyncio.create_task(adm.acquire(d)) for d in demands]
    await asyncio.sleep(0)
    return tasks


async def test_a_newcomer_starts_at_once_behind_another_flows_burst() -> None:
    adm = Admission(concurrency=4, max_queue=16)
    adm.release(await adm.acquire(Demand(flow="b")))  # b used the replica recently: it is shared
    burst = await started(adm, [Demand(flow="a")] * 10)
    assert adm.running == 3 and adm.waiting == 7  # a keeps one slot free for a flow with nothing running
    newcomer = await asyncio.wait_for(adm.acquire(Demand(flow="b")), 1)
    assert adm.running == 4 and newcomer.demand.flow == "b"
    for t in burst:
        t.cancel()
    await asyncio.gather(*burst, return_exceptions=True)


@pytest.mark.parametrize(("policy", "slots", "running"), [
    (SchedulerConfig(newcomer_slots=0), 4, 4),  # work-conserving: the burst takes every slot
    (SchedulerConfig(policy="fifo"), 4, 4),
    (SchedulerConfig(), 3, 2),
    (SchedulerConfig(), 2, 1),  # two slots (issue 38): the burst holds one, the other is kept for b
    (SchedulerConfig(newcomer_slots=2), 8, 6),
])
async def test_newcomer_slots_table(policy: SchedulerConfig, slots: int, running: int) -> None:
    adm = Admission(concurrency=slots, max_queue=16, policy=policy)
    adm.release(await adm.acquire(Demand(flow="b")))
    burst = await started(adm, [Demand(flow="a")] * 10)
    assert adm.running == running
    for t in burst:
        t.cancel()
    await asyncio.gather(*burst, return_exceptions=True)


async def test_the_prefill_budget_lets_short_prompts_pass_long_ones() -> None:
    adm = Admission(concurrency=4, max_queue=16, policy=SchedulerConfig(prefill_budget_tokens=3000, newcomer_slots=0))
    doc = await adm.acquire(Demand(flow="batch", prompt_tokens=2000))
    second_doc = (await started(adm, [Demand(flow="batch", prompt_tokens=2000)]))[0]
    chat = await asyncio.wait_for(adm.acquire(Demand(flow="chat", prompt_tokens=30)), 1)  # fits beside the first
    assert not second_doc.done() and adm.prefill_tokens == 2030
    adm.prefilled(doc)  # its first token came: its prompt leaves the budget
    await asyncio.sleep(0)
    assert second_doc.done() and adm.prefill_tokens == 2030
    adm.release(chat)
    adm.release(doc)
    adm.release(second_doc.result())
    assert (adm.running, adm.prefill_tokens) == (0, 0)


async def test_a_prompt_over_the_whole_budget_still_starts_alone() -> None:
    adm = Admission(concurrency=2, max_queue=4, policy=SchedulerConfig(prefill_budget_tokens=100))
    ticket = await asyncio.wait_for(adm.acquire(Demand(prompt_tokens=5000)), 1)
    adm.release(ticket)
    assert adm.prefill_tokens == 0


async def test_a_deadline_that_passes_in_the_queue_raises_and_frees_the_place() -> None:
    adm = Admission(concurrency=1, max_queue=4)
    held = await adm.acquire()
    loop = asyncio.get_running_loop()
    with pytest.raises(DeadlineExceeded):
        await adm.acquire(Demand(flow="x", deadline=loop.time() + 0.05))
    assert adm.waiting == 0
    with pytest.raises(DeadlineExceeded):  # already past on arrival: refused without queueing
        await adm.acquire(Demand(deadline=loop.time() - 1))
    adm.release(held)
    ticket = await adm.acquire(Demand(deadline=loop.time() + 60))  # a free slot: met
    adm.release(ticket)


async def test_a_displaced_waiter_is_refused_with_the_reason() -> None:
    adm = Admission(concurrency=1, max_queue=2, policy=SchedulerConfig(newcomer_slots=0))
    held = await adm.acquire(Demand(flow="a"))
    waiters = await started(adm, [Demand(flow="a"), Demand(flow="a")])
    b = asyncio.create_task(adm.acquire(Demand(flow="b")))
    await asyncio.sleep(0)
    with pytest.raises(Refusal) as refused:
        await waiters[1]  # a's newest waiter made room for b
    assert refused.value.reason == "flow_share" and adm.waiting == 2
    with pytest.raises(Refusal) as own:
        await adm.acquire(Demand(flow="a"))
    assert own.value.reason == "queue_full"
    adm.release(held)
    first = await waiters[0]
    adm.release(first)
    adm.release(await b)
    assert (adm.running, adm.waiting) == (0, 0)


async def test_fifo_policy_serves_in_arrival_order_whatever_the_flow_or_tier() -> None:
    adm = Admission(concurrency=1, max_queue=8, policy=SchedulerConfig(policy="fifo"))
    held = await adm.acquire()
    order: list[str] = []

    async def one(label: str, demand: Demand) -> None:
        ticket = await adm.acquire(demand)
        order.append(label)
        adm.release(ticket)

    tasks = [asyncio.create_task(one(f"{flow}{tier[0]}", Demand(flow=flow, tier=tier)))  # type: ignore[arg-type]
             for flow, tier in [("a", "flex"), ("a", "default"), ("b", "priority")]]
    await asyncio.sleep(0)
    adm.release(held)
    await asyncio.gather(*tasks)
    assert order == ["af", "ad", "bp"]


async def test_one_flow_alone_keeps_every_slot() -> None:
    adm = Admission(concurrency=4, max_queue=16)
    burst = await started(adm, [Demand(flow="a")] * 6)
    assert adm.running == 4  # no other flow used the replica within the window: nothing is held back
    for t in burst:
        t.cancel()
    await asyncio.gather(*burst, return_exceptions=True)


async def test_a_flow_leaves_the_window_after_its_last_request() -> None:
    adm = Admission(concurrency=4, max_queue=16, policy=SchedulerConfig(flow_window_seconds=0.05))
    adm.release(await adm.acquire(Demand(flow="b")))
    await asyncio.sleep(0.1)
    burst = await started(adm, [Demand(flow="a")] * 6)
    assert adm.running == 4
    for t in burst:
        t.cancel()
    await asyncio.gather(*burst, return_exceptions=True)


async def test_the_kept_slot_goes_to_a_flow_below_its_share() -> None:
    adm = Admission(concurrency=4, max_queue=16)
    a = await started(adm, [Demand(flow="a")] * 6)
    b = await started(adm, [Demand(flow="b")] * 6)  # arrived when a held every slot
    assert adm.running == 4 and adm.waiting == 8
    for t in a[:2]:  # two of a's finish: b (0 running, share 2) takes one, then the kept slot
        adm.release(t.result())
    await asyncio.sleep(0)
    running = [t for t in a + b if t.done() and not t.cancelled()]
    assert adm.running == 4 and sum(t in b for t in running) == 2  # both flows backlogged: every slot in use
    for t in a + b:
        t.cancel()
    await asyncio.gather(*a, *b, return_exceptions=True)


async def test_a_long_prompt_is_not_starved_by_short_ones_that_keep_the_budget_busy() -> None:
    """Issue 32, item 8: budget 1000, a 900-token prompt, 300-token prompts arriving one as another's
    prefill ends: before, every 300 started at once and the 900 never did (nor its flow's next request)."""
    adm = Admission(concurrency=16, max_queue=64, policy=SchedulerConfig(prefill_budget_tokens=1000, newcomer_slots=0))
    prefilling = [await adm.acquire(Demand(flow="chat", prompt_tokens=300)) for _ in range(2)]
    doc, doc_next = await started(adm, [Demand(flow="batch", prompt_tokens=900), Demand(flow="batch", prompt_tokens=50)])
    chats: list[asyncio.Task[Ticket]] = []
    for _ in range(10):  # one chat's first token, then the next chat arrives: the budget never empties
        if prefilling:
            adm.prefilled(prefilling.pop(0))
        chats += await started(adm, [Demand(flow="chat", prompt_tokens=300)])
        await asyncio.sleep(0)
        prefilling += [t.result() for t in chats if t.done() and t.result().prefilling and t.result() not in prefilling]
        if doc.done():
            break
    assert doc.done() and doc_next.done()
    assert sum(t.done() for t in chats) <= 4 + 1  # a budget's worth passed it (plus the one that reached it)
    for t in chats:
        t.cancel()
    await asyncio.gather(*chats, return_exceptions=True)


async def test_a_kept_slot_is_handed_out_when_the_flow_it_was_kept_for_has_left() -> None:
    """Issue 32, item 8: the slot kept for b stayed idle after b's window ended until something arrived."""
    adm = Admission(concurrency=4, max_queue=16, policy=SchedulerConfig(flow_window_seconds=0.05))
    adm.release(await adm.acquire(Demand(flow="b")))  # b used the replica: the last slot is kept for it
    burst = await started(adm, [Demand(flow="a")] * 6)
    assert adm.running == 3 and adm.waiting == 3
    # nothing arrives and nothing ends: b's window lapses and a's next waiter takes the slot
    fourth = burst[3]
    await asyncio.wait_for(asyncio.shield(fourth), 5)
    assert adm.running == 4 and adm.waiting == 2
    for t in burst:
        t.cancel()
    await asyncio.gather(*burst, return_exceptions=True)

