"""Work that stops when the client leaves.

A request gives no write that could fail when its client goes away (uvicorn drops what is sent
after a disconnect), so the gateway listens for the ASGI `http.disconnect` message while the
work runs (queue wait, generation, and a stream until its end) and cancels the work when it
arrives. Cancellation is how every adapter stops: the in-process engines' workers stop at the
next token, a queued request leaves the queue, the relay closes its upstream connection.

`ClientWatch` is the one watcher a generation request has: one task, from after the body until
the response is complete, that cancels the request's own task (the work runs in it, with no
task of its own). `unless_disconnected` runs work in a task of its own instead.

Concurrency rule: start either once the request body has been read; the watcher then consumes
`receive` (only `http.disconnect` can come after the body). Stop a `ClientWatch` before the
response's last message (after it, uvicorn answers every `receive` with `http.disconnect`).
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


class ClientWatch:
    """Cancels the task that made it when the client disconnects, until `stop()`.

    The cancellation lands where that task is suspended, so work that finishes and then calls
    `stop()` with no await in between is never cancelled after its end; code that catches the
    CancelledError asks `caused()` whether the client's leaving caused it (as `Drain.ending`)."""

    __slots__ = ("_task", "_watcher", "_live", "_gone", "_taken_back")

    def __init__(self, receive: Receive) -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        assert task is not None
        self._task: asyncio.Task[object] = task
        self._live = True
        self._gone = False
        self._taken_back = False
        self._watcher = loop.create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        await _disconnected(receive)
        if self._live:
            self._live = False
            self._gone = True
            self._task.cancel()

    @property
    def task(self) -> asyncio.Task[object]:
        """The watched task (the request's own)."""
        return self._task

    @property
    def gone(self) -> bool:
        """The client left while watched (its task was cancelled for it)."""
        return self._gone

    def stop(self) -> None:
        """From now on a disconnect cancels nothing. The watcher is not cancelled: its `receive` returns
        `http.disconnect` once the response is complete (ASGI servers answer every `receive` after the
        last message so), and it ends then by itself, which costs less than a cancellation thrown
        through its frames."""
        self._live = False

    def caused(self) -> bool:
        """In an `except CancelledError` of the watched task: True when the client's leaving cancelled
        it; that cancellation is taken back (uncancel, once) and the caller finishes its response."""
        if not self._gone or self._task is not asyncio.current_task():
            return False
        if not self._taken_back:
            self._taken_back = True
            self._task.uncancel()
        return True


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
