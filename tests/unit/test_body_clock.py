"""gateway/middleware.py's BodyClock: asyncio.timeout_at's contract for a request body's reads, one timer
per request. The slow-client integration test (tests/integration/test_slow_clients.py) covers the 408."""

from __future__ import annotations

import asyncio

import pytest

from gateway.middleware import BodyClock


def chunk(more: bool = True) -> dict[str, object]:
    return {"type": "http.request", "body": b"x", "more_body": more}


async def test_a_read_that_waits_past_the_deadline_raises_timeout_and_later_reads_at_once() -> None:
    never: asyncio.Future[dict[str, object]] = asyncio.get_running_loop().create_future()
    clock = BodyClock(0.1)
    assert await clock.receive(lambda: asyncio.sleep(0, chunk())) == chunk()  # in time
    with pytest.raises(TimeoutError):
        await clock.receive(lambda: never)  # the client stalls
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]  # its own cancel taken back
    with pytest.raises(TimeoutError):
        await clock.receive(lambda: asyncio.sleep(0, chunk()))  # past it: no read at all
    clock.stop()


async def test_expiry_between_reads_cancels_nothing_and_the_next_read_raises() -> None:
    clock = BodyClock(0.05)
    await clock.receive(lambda: asyncio.sleep(0, chunk()))
    await asyncio.sleep(0.1)  # the app works on the first chunk past the deadline: not cancelled
    with pytest.raises(TimeoutError):
        await clock.receive(lambda: asyncio.sleep(0, chunk(False)))
    clock.stop()


async def test_a_stopped_clock_never_fires_and_another_cancellation_propagates() -> None:
    clock = BodyClock(0.05)
    await clock.receive(lambda: asyncio.sleep(0, chunk(False)))
    clock.stop()  # the body is complete
    await asyncio.sleep(0.1)
    assert not clock.expired

    started = asyncio.Event()

    async def reader() -> None:
        async def waits() -> dict[str, object]:
            started.set()
            await asyncio.sleep(30)
            return chunk()
        await BodyClock(30).receive(waits)

    task = asyncio.ensure_future(reader())
    await started.wait()
    task.cancel()  # the client left, the drain: not the clock's
    with pytest.raises(asyncio.CancelledError):
        await task
