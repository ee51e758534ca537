"""Work that stops when the client leaves.

A non-streaming request gives no write that could fail when its client goes away, so the
gateway listens for the ASGI `http.disconnect` message while the work runs (queue wait and
generation) and cancels the work when it arrives. Cancellation is how every adapter stops:
the in-process engines' workers stop at the next token, a queued request leaves the queue,
the relay closes its upstream connection.

Concurrency rule: call it once the request body has been read; the watcher then consumes
`receive` (only `http.disconnect` can come after the body), and is cancelled before a response
starts, so a streaming response can listen on `receive` afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from starlette.types import Receive

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before the response began; the work was cancelled."""


async def _disconnected(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(receive: Receive, work: Awaitable[T], discard: Callable[[T], None]) -> T:
    """The result of `work`, or ClientGone once it was cancelled because the client left first.

    `discard` receives a result that was ready anyway when the client left (to free what it holds).
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    try:
        result = await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise  # this handler itself is being cancelled (shutdown)
    except Exception:  # noqa: S110 - what the work failed with no longer reaches anyone
        pass
    else:
        discard(result)  # it finished before the cancellation landed
    raise ClientGone
