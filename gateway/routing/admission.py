"""Per-backend admission: a fixed number of concurrent generations and a bounded wait queue.

Concurrency rule: `slot()` is entered on the event loop only. A request that finds every
slot busy and `max_queue` requests already waiting is refused at once with `QueueFull`
(the API answers 429 with Retry-After); otherwise it waits its turn in FIFO order.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class QueueFull(Exception):
    pass


class Admission:
    def __init__(self, concurrency: int = 1, max_queue: int = 16) -> None:
        self._semaphore = asyncio.Semaphore(concurrency)
        self.concurrency = concurrency
        self.max_queue = max_queue
        self.waiting = 0
        self.running = 0

    async def acquire(self) -> None:
        if self._semaphore.locked() and self.waiting >= self.max_queue:
            raise QueueFull(f"{self.running} running and {self.waiting} waiting (queue limit {self.max_queue})")
        self.waiting += 1
        try:
            await self._semaphore.acquire()
        finally:
            self.waiting -= 1
        self.running += 1

    def release(self) -> None:
        self.running -= 1
        self._semaphore.release()

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        await self.acquire()
        try:
            yield
        finally:
            self.release()
