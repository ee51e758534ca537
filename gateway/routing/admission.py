"""Per-replica admission: the engine's concurrent generations and a bounded wait queue.

Concurrency rule: `acquire()`/`release()`/`resize()` run on the event loop only. A request that
finds every slot busy and `max_queue` requests already waiting is refused at once with
`QueueFull` (the API answers 429 with Retry-After); otherwise it waits its turn in FIFO order.
`concurrency=None` is no gateway cap at all (an external URL that queues on its own);
`resize()` follows the capacity the engine reports after it started (llama-server's slots).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class QueueFull(Exception):
    pass


class Admission:
    def __init__(self, concurrency: int | None = 1, max_queue: int = 16) -> None:
        self.concurrency = concurrency
        self.max_queue = max_queue
        self.running = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def free(self) -> bool:
        """A request arriving now would start at once."""
        return self.concurrency is None or (self.running < self.concurrency and not self._waiters)

    @property
    def full(self) -> bool:
        """A request arriving now would be refused."""
        return not self.free and self.waiting >= self.max_queue

    async def acquire(self) -> None:
        if self.free:
            self.running += 1
            return
        if self.waiting >= self.max_queue:
            raise QueueFull(f"{self.running} running and {self.waiting} waiting (queue limit {self.max_queue})")
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # release() counts us as running before it wakes us
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release()  # woken and cancelled at once: hand the slot on
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        self.running -= 1
        self._wake()

    def resize(self, concurrency: int | None) -> None:
        self.concurrency = concurrency
        self._wake()

    def _wake(self) -> None:
        while self._waiters and (self.concurrency is None or self.running < self.concurrency):
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.running += 1
                waiter.set_result(None)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        await self.acquire()
        try:
            yield
        finally:
            self.release()
