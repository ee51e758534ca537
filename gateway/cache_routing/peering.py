"""The placement notes between gateways, over Redis pub/sub (`routing.cache_peers`): the side effects.

Concurrency rule: `publish` runs on the event loop inside the router's choice and never awaits: it
puts the note on a bounded queue (a full queue drops it, counted) that a sender task drains. A listener
task applies the other gateways' notes through `apply`, on the event loop too. Neither task ever fails
a request: while Redis is down notes are dropped, each gateway routes on what it placed itself (the
single-gateway behaviour), and both tasks reconnect with backoff. Pub/sub delivers at most once, to
gateways subscribed at that moment: a gateway that was away misses what was placed meanwhile, which
its index then learns from the engine's reports, as it does any miss.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.cache_routing.peers import Note, decode, encode

log = logging.getLogger("enginegate.routing")

QUEUE = 1024
"""Notes waiting to be sent before new ones are dropped."""
BACKOFF = (0.25, 0.5, 1.0, 2.0, 5.0)
"""Seconds between reconnection attempts, the last repeated."""
TIMEOUT_S = 2.0


@dataclass(slots=True)
class PeerCounts:
    sent: int = 0
    dropped: int = 0
    """Not sent: the queue was full or Redis was unreachable."""
    received: int = 0
    applied: int = 0
    """Received notes that named one of this gateway's replicas."""
    ignored: int = 0
    """Received but malformed, cut in other blocks, or for no replica of ours."""
    errors: int = 0
    """Connections lost or refused (each reconnection attempt that failed counts)."""


class PeerFeed:
    def __init__(self, url: str, channel: str, apply: Callable[[Note], bool], block_chars: int) -> None:
        self.url = url
        self.channel = channel
        self.block_chars = block_chars
        self.sender = uuid.uuid4().hex
        self.counts = PeerCounts()
        self.listening = False
        """Subscribed now (notes from the other gateways arrive)."""
        self._apply = apply
        self._queue: asyncio.Queue[bytes] = asyncio.Queue(QUEUE)
        self._tasks: list[asyncio.Task[None]] = []

    def publish(self, replica: str, blocks: Sequence[int]) -> None:
        if not self._tasks:
            return
        try:
            self._queue.put_nowait(encode(Note(self.sender, replica, self.block_chars, tuple(blocks))))
        except asyncio.QueueFull:
            self.counts.dropped += 1

    async def start(self) -> None:
        if not self._tasks:
            self._tasks = [asyncio.create_task(self._send(), name="cache-peers-send"),
                           asyncio.create_task(self._listen(), name="cache-peers-listen")]

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.listening = False

    def status(self) -> dict[str, Any]:
        c = self.counts
        return {"listening": self.listening, "sent": c.sent, "dropped": c.dropped, "received": c.received,
                "applied": c.applied, "ignored": c.ignored, "errors": c.errors}

    def _client(self, timeout: float | None) -> Any:
        import redis.asyncio as aioredis

        return aioredis.Redis.from_url(self.url, socket_connect_timeout=TIMEOUT_S, socket_timeout=timeout)

    async def _send(self) -> None:
        from redis.exceptions import RedisError

        failures = 0
        client = self._client(TIMEOUT_S)
        try:
            while True:
                note = await self._queue.get()
                try:
                    await client.publish(self.channel, note)
                    self.counts.sent += 1
                    failures = 0
                except (RedisError, OSError) as exc:
                    self.counts.dropped += 1 + self._drain()  # stale by the time Redis is back: drop what waits
                    self.counts.errors += 1
                    if failures == 0:
                        log.warning("cache peers: publishing to %s failed (%s); routing on this gateway's own "
                                    "placements until it is back", self._where(), type(exc).__name__)
                    await asyncio.sleep(BACKOFF[min(failures, len(BACKOFF) - 1)])
                    failures += 1
                    self.counts.dropped += self._drain()
        finally:
            await client.aclose()

    def _drain(self) -> int:
        n = 0
        while not self._queue.empty():
            self._queue.get_nowait()
            n += 1
        return n

    async def _listen(self) -> None:
        from redis.exceptions import RedisError

        failures = 0
        while True:
            client = self._client(None)
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel)
                self.listening = True
                if failures:
                    log.warning("cache peers: subscribed to %s again", self._where())
                failures = 0
                while True:
                    message = await pubsub.get_message(timeout=1.0)
                    if message is None or message.get("type") != "message":
                        continue
                    self._received(message.get("data"))
            except (RedisError, OSError) as exc:
                self.listening = False
                self.counts.errors += 1
                if failures == 0:
                    log.warning("cache peers: subscription to %s lost (%s); reconnecting", self._where(),
                                type(exc).__name__)
                await asyncio.sleep(BACKOFF[min(failures, len(BACKOFF) - 1)])
                failures += 1
            finally:
                self.listening = False
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
                with contextlib.suppress(Exception):
                    await client.aclose()

    def _received(self, data: object) -> None:
        note = decode(data, self.block_chars) if isinstance(data, bytes | str) else None
        if note is not None and note.sender == self.sender:
            return  # its own, back from the channel
        self.counts.received += 1
        if note is None or not self._apply(note):
            self.counts.ignored += 1
            return
        self.counts.applied += 1

    def _where(self) -> str:
        """The URL without its credentials (never logged)."""
        rest = self.url.split("@", 1)[-1]
        return rest if "://" in rest else self.url.split("://", 1)[0] + "://" + rest
