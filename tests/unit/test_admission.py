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
