"""Items made in an in-process engine's worker thread, consumed on the event loop.

Concurrency rule: `put` is called from the worker thread only and hands each item to the loop
that created the stream (`call_soon_threadsafe`); `items()` is iterated on that loop. The
consumer sets `cancelled` when it stops early (the client left); the worker checks it between
tokens and stops there.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from typing import Any

_END = object()


class ThreadStream:
    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self.cancelled = threading.Event()
        self.future: asyncio.Future[None] | None = None

    def put(self, item: Any) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def run(self, executor: Executor, work: Callable[[], None], on_dequeue: Callable[[], None] | None = None) -> None:
        """Run `work` on `executor`; what it raises reaches `items()`. `on_dequeue` runs in the
        worker first, even when the stream was cancelled while it waited for the thread."""

        def produce() -> None:
            if on_dequeue is not None:
                on_dequeue()
            if self.cancelled.is_set():
                self.put(_END)
                return
            try:
                work()
            except BaseException as exc:  # delivered to the event loop, raised there
                self.put(exc)
            finally:
                self.put(_END)

        self.future = self._loop.run_in_executor(executor, produce)

    async def items(self, translate: Callable[[BaseException], BaseException]) -> AsyncIterator[Any]:
        """Each item the worker put, until it finished; an exception it raised is raised here as
        `translate(exception)`."""
        while True:
            item = await self._queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise translate(item)
            yield item
