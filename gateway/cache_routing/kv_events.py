"""The precise cache view of one vLLM replica, kept from its KV cache events (a `PreciseCache`).

vLLM launched with `--kv-events-config` (adapters/vllm.py, option `kv_events`) publishes each
engine step's cache changes on a ZMQ PUB socket as frames (topic, 8-byte big-endian sequence
number, msgpack `KVEventBatch`), and keeps the last batches for replay on a ROUTER socket: a
request carrying a start sequence number is answered with every buffered batch from there, then
an end marker (sequence -1). One task here subscribes, replays what it missed (the batches before
it connected, and any gap in the sequence numbers), and feeds a `TokenBlockIndex`.

Trust: the view answers only while it has applied every batch of this launch in order. A gap the
replay cannot fill (the engine's replay buffer rolled over) empties the index and the view answers
None, so the router uses its approximate index, until the engine clears its cache (AllBlocksCleared:
then it is exact again) or restarts. A new launch (a restart: the adapter names a new endpoint for
each) starts a new, empty index. `matched_tokens` asks the replica's own `/tokenize` (which applies
the chat template the way a chat request will) and answers None when that fails or when the prompt
is something token ids alone do not name (images, a cache salt, the Responses API).

Concurrency: everything runs on one event loop; the subscriber task is the only writer of the index.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec
import zmq
import zmq.asyncio

from adapters.process import ProcessState
from gateway.cache_routing.token_index import MAX_BLOCKS, EngineHash, TokenBlockIndex

log = logging.getLogger("enginegate.kv_events")

PRIMARY_MEDIUM = "GPU"
"""vLLM's name for its own KV pool (on a CPU too); offload tiers (CPU, STORAGE) are not counted."""
REPLAY_END = -1
RECEIVE_QUEUE = 10_000
"""Batches ZMQ keeps for the view while it reads a replay or falls behind (more are dropped, then
replayed: vLLM's replay buffer holds as many, adapters/vllm.py KV_EVENTS_REPLAY_STEPS)."""


class BlockStored(msgspec.Struct, tag=True):
    block_hashes: list[EngineHash]
    parent_block_hash: EngineHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None


class BlockRemoved(msgspec.Struct, tag=True):
    block_hashes: list[EngineHash]
    medium: str | None = None
    group_idx: int | None = None


class AllBlocksCleared(msgspec.Struct, tag=True):
    pass


class KVEventBatch(msgspec.Struct, array_like=True):
    """vLLM's batch (vllm/distributed/kv_events.py): only the fields read here are declared."""

    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


_decode = msgspec.msgpack.Decoder(KVEventBatch).decode


def _counts(event: BlockStored | BlockRemoved) -> bool:
    return event.medium in (None, PRIMARY_MEDIUM) and event.group_idx in (None, 0)


class Feed:
    """One launch's batches applied in sequence order to its index. Pure: the caller does the I/O."""

    def __init__(self, max_blocks: int = MAX_BLOCKS) -> None:
        self.index = TokenBlockIndex(max_blocks)
        self.next_seq = 0
        self.trusted = True
        """Every batch of this launch since its start (or its last AllBlocksCleared) was applied."""

    def gap(self, seq: int) -> bool:
        """Batches before `seq` are missing (the caller replays from `next_seq`, then offers `seq`)."""
        return seq > self.next_seq

    def offer(self, seq: int, batch: KVEventBatch) -> None:
        """Apply the batch numbered `seq`: once (a repeat is ignored); past a gap, as a new start."""
        if seq < self.next_seq:
            return
        if seq > self.next_seq:
            self.lost(seq)
        self.next_seq = seq + 1
        for event in batch.events:
            if isinstance(event, BlockStored):
                if _counts(event):
                    plain = event.lora_name is None and event.lora_id is None and not any(event.extra_keys or ())
                    self.index.stored(event.block_hashes, event.parent_block_hash, event.token_ids,
                                      event.block_size, plain)
            elif isinstance(event, BlockRemoved):
                if _counts(event):
                    self.index.removed(event.block_hashes)
            else:
                self.index.cleared()
                self.trusted = True

    def lost(self, resume_at: int) -> None:
        """Batches up to `resume_at` cannot be had: what the index holds is no longer known."""
        log.warning("kv events: batches %d..%d lost; the precise view distrusts itself", self.next_seq, resume_at - 1)
        self.index.cleared()
        self.trusted = False
        self.next_seq = resume_at


def _offer(feed: Feed, seq: int, payload: bytes) -> None:
    try:
        batch = _decode(payload)
    except msgspec.DecodeError as exc:  # a newer vLLM's event kind: what that batch changed is unknown
        log.warning("kv events: batch %d unreadable (%s)", seq, exc)
        if seq >= feed.next_seq:
            feed.lost(seq + 1)
        return
    feed.offer(seq, batch)


@dataclass(frozen=True, slots=True)
class EngineLink:
    """Where one launch of the engine publishes its events and serves /tokenize."""

    events: str
    replay: str | None
    base_url: str
    api_key: str | None = None


CHAT_PASSTHROUGH = ("tools", "add_generation_prompt", "continue_final_message", "add_special_tokens", "chat_template",
                    "chat_template_kwargs")
"""The chat request's fields that change the rendered prompt, and vLLM's /tokenize takes too."""


def tokenize_request(body: Mapping[str, Any], path: str) -> dict[str, Any] | list[int] | None:
    """What to send to vLLM's /tokenize for this request (or its token ids, when it already is token
    ids); None when token ids alone would not name what the engine caches for it."""
    if body.get("cache_salt") is not None:  # salted blocks are hashed apart from everyone else's
        return None
    if path.endswith("/chat/completions"):
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return None
        for message in messages:
            content = message.get("content") if isinstance(message, Mapping) else None
            if isinstance(content, list) and any(not isinstance(p, Mapping) or p.get("type") != "text" for p in content):
                return None  # an image or audio part: its blocks carry the media's hash
        request = {"messages": messages}
        request.update({k: body[k] for k in CHAT_PASSTHROUGH if body.get(k) is not None})
        return request
    if path.endswith("/completions"):
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return prompt
        if isinstance(prompt, str) and prompt:
            return {"prompt": prompt, "add_special_tokens": body.get("add_special_tokens", True)}
    return None


class KvEventsCache:
    """A `PreciseCache` (gateway/cache_routing/precise.py) for one vLLM replica.

    `link` says where the engine's current launch is (None while it does not serve); it is read
    often and must be cheap. A change of `link().events` is a new launch: the view starts over."""

    def __init__(self, link: Callable[[], EngineLink | None], *, max_blocks: int = MAX_BLOCKS,
                 tokenize_timeout: float = 2.0, replay_timeout: float = 5.0, poll_seconds: float = 0.2,
                 settle_seconds: float = 0.1) -> None:
        self._link = link
        self._max_blocks = max_blocks
        self._tokenize_timeout = tokenize_timeout
        self._replay_timeout = replay_timeout
        self._poll = poll_seconds
        self._settle = settle_seconds
        self._feed = Feed(max_blocks)
        self._launch: str | None = None
        self._caught_up = False
        self._task: asyncio.Task[None] | None = None
        self._ctx: zmq.asyncio.Context | None = None
        self._http: httpx.AsyncClient | None = None

    @classmethod
    def for_adapter(cls, adapter: Any, **kwargs: Any) -> KvEventsCache:
        """The view of a supervised vLLM adapter whose `describe()` names `kv_events_endpoint`."""
        def link() -> EngineLink | None:
            process = adapter.process
            if process.state is not ProcessState.READY or process.endpoint is None:
                return None
            info = adapter.describe()
            events = info.get("kv_events_endpoint")
            if not events:
                return None
            endpoint = process.endpoint
            return EngineLink(str(events), info.get("kv_events_replay_endpoint"), endpoint.base_url,
                              endpoint.api_key or None)
        return cls(link, **kwargs)

    @property
    def index(self) -> TokenBlockIndex:
        return self._feed.index

    @property
    def next_seq(self) -> int:
        """The sequence number of the engine's next batch of events (how far the view has read)."""
        return self._feed.next_seq

    @property
    def answering(self) -> bool:
        """True while `matched_tokens` can answer: following the engine's current launch, caught up
        with its events, no unfilled gap."""
        link = self._link()
        return self._caught_up and self._feed.trusted and link is not None and link.events == self._launch

    async def start(self) -> None:
        if self._task is not None and not self._task.done():
            return
        self._ctx = zmq.asyncio.Context()
        self._http = httpx.AsyncClient(timeout=self._tokenize_timeout)
        self._task = asyncio.create_task(self._run(), name="kv-events")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None
        self._caught_up = False

    def reset(self) -> None:
        """Forget what the engine holds; a launch that still runs is relearned from its replay buffer."""
        self._feed = Feed(self._max_blocks)
        self._caught_up = False
        self._launch = None  # the subscriber starts over on its next message

    async def matched_tokens(self, body: Mapping[str, Any], path: str) -> int | None:
        if not self.answering:
            return None
        if not len(self.index):
            return 0  # the engine holds nothing: no need to tokenize
        feed = self._feed
        tokens = await self.tokens(body, path)
        if tokens is None or feed is not self._feed:
            return None
        return self.matched(tokens)

    async def tokens(self, body: Mapping[str, Any], path: str) -> list[int] | None:
        """The request's prompt as this engine tokenizes it (one /tokenize call). Replicas of one model
        tokenize alike, so a router may ask one of them and `matched` the tokens on every replica."""
        link = self._link()
        request = tokenize_request(body, path) if link is not None else None
        if link is None or request is None:
            return None
        return request if isinstance(request, list) else await self._tokenize(link, request)

    def matched(self, tokens: Sequence[int]) -> int | None:
        """Leading tokens of these prompt tokens the engine holds now (whole blocks); None when it cannot tell."""
        return self._feed.index.matched_tokens(tokens) if self.answering else None

    async def _tokenize(self, link: EngineLink, request: dict[str, Any]) -> list[int] | None:
        if self._http is None:
            return None
        headers = {"Authorization": f"Bearer {link.api_key}"} if link.api_key else {}
        try:
            response = await self._http.post(f"{link.base_url}/tokenize", json=request, headers=headers)
            tokens = response.json().get("tokens") if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            log.debug("kv events: /tokenize failed: %s", exc)
            return None
        if not isinstance(tokens, list):
            log.debug("kv events: /tokenize answered %s", response.status_code)
            return None
        return tokens

    # -- the subscriber --------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            link = self._link()
            if link is None:
                self._caught_up = False
                await asyncio.sleep(self._poll)
                continue
            try:
                await self._follow(link)
            except zmq.ZMQError as exc:
                log.warning("kv events from %s: %s; subscribing again", link.events, exc)
                await asyncio.sleep(self._poll)
            except Exception:  # a fault here must not leave a frozen view answering
                log.exception("kv events from %s: the view starts over", link.events)
                self.reset()
                await asyncio.sleep(self._poll)

    async def _follow(self, link: EngineLink) -> None:
        """Follow one launch until the link changes."""
        if link.events != self._launch:
            self._feed = Feed(self._max_blocks)
            self._launch = link.events
        assert self._ctx is not None
        sub = self._ctx.socket(zmq.SUB)
        replay = self._ctx.socket(zmq.DEALER) if link.replay else None
        try:
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)
            sub.connect(link.events)
            if replay is not None and link.replay:
                replay.connect(link.replay)
            await asyncio.sleep(self._settle)  # let the subscription reach the publisher first
            await self._replay(replay, self._feed)
            self._caught_up = True
            poll_ms = int(self._poll * 1000)
            while self._link() == link and self._launch == link.events:
                if not await sub.poll(poll_ms):
                    continue
                frames = await sub.recv_multipart()
                if len(frames) != 3:
                    continue
                seq, feed = int.from_bytes(frames[1], "big"), self._feed
                if feed.gap(seq):
                    await self._replay(replay, feed)
                _offer(feed, seq, frames[2])
        finally:
            self._caught_up = False
            sub.close(linger=0)
            if replay is not None:
                replay.close(linger=0)

    async def _replay(self, replay: zmq.asyncio.Socket | None, feed: Feed) -> None:
        """Apply the buffered batches from `feed.next_seq` on; a batch the buffer no longer has is lost."""
        if replay is None:
            return
        await replay.send_multipart([b"", feed.next_seq.to_bytes(8, "big")])
        while await replay.poll(int(self._replay_timeout * 1000)):
            frames = await replay.recv_multipart()
            if len(frames) != 4:
                continue
            seq = int.from_bytes(frames[2], "big", signed=True)
            if seq == REPLAY_END:
                return
            _offer(feed, seq, frames[3])
        log.warning("kv events: no replay answer in %.0fs", self._replay_timeout)
