"""The KV-event view without an engine: the sequence rules (table), what is sent to /tokenize (table),
and the subscriber against an emulation of vLLM's publisher (tests/emulators/kv_event_publisher.py):
a late join, a lost batch replayed, a lost batch the replay no longer has, a new launch."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gateway.cache_routing.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineLink,
    Feed,
    KVEventBatch,
    KvEventsCache,
    tokenize_request,
)
from tests.emulators.kv_event_publisher import CLEARED, KvEventPublisher, removed, stored

B = 4
TOKENS = list(range(50, 63))  # 13 tokens: 3 whole blocks reusable
COMPLETION = "/v1/completions"


def batch(*events: BlockStored | BlockRemoved | AllBlocksCleared) -> KVEventBatch:
    return KVEventBatch(0.0, list(events))


FIRST = BlockStored([1, 2], None, TOKENS[:8], B)
THIRD = BlockStored([3], 2, TOKENS[8:12], B)


@pytest.mark.parametrize("offers, trusted, next_seq, matched", [
    ([(0, batch(FIRST)), (1, batch(THIRD))], True, 2, 12),
    ([(0, batch(FIRST)), (0, batch(FIRST)), (1, batch(THIRD))], True, 2, 12),  # a replayed repeat counts once
    ([(0, batch(FIRST)), (1, batch(BlockRemoved([2])))], True, 2, 4),
    ([(0, batch(FIRST)), (1, batch(BlockRemoved([2], medium="CPU")))], True, 2, 8),  # an offload tier's eviction
    ([(0, batch(FIRST)), (1, batch(BlockStored([3], 2, TOKENS[8:12], B, group_idx=1)))], True, 2, 8),
    ([(0, batch(FIRST)), (2, batch(THIRD))], False, 3, 0),  # batch 1 lost: distrust, know nothing
    ([(0, batch(FIRST)), (2, batch(THIRD)), (3, batch(AllBlocksCleared()))], True, 4, 0),  # cleared: exact again
    ([(0, batch(FIRST)), (2, batch(THIRD)), (3, batch(AllBlocksCleared(), FIRST))], True, 4, 8),
    ([(0, batch(BlockStored([1], None, TOKENS[:4], B, extra_keys=[("salt",)])))], True, 1, 0),
    ([(0, batch(BlockStored([1], None, TOKENS[:4], B, lora_name="adapter")))], True, 1, 0),
], ids=["in-order", "repeat", "removed", "other-medium", "other-group", "gap", "gap-then-cleared",
        "cleared-then-stored", "salted", "lora"])
def test_feed(offers: list[tuple[int, KVEventBatch]], trusted: bool, next_seq: int, matched: int) -> None:
    feed = Feed()
    for seq, b in offers:
        feed.offer(seq, b)
    assert (feed.trusted, feed.next_seq, feed.index.matched_tokens(TOKENS)) == (trusted, next_seq, matched)


MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


@pytest.mark.parametrize("body, path, sent", [
    ({"messages": MESSAGES, "max_tokens": 3, "stream": True}, "/v1/chat/completions", {"messages": MESSAGES}),
    ({"messages": MESSAGES, "tools": [{"type": "function"}], "chat_template_kwargs": {"x": 1}},
     "/v1/chat/completions", {"messages": MESSAGES, "tools": [{"type": "function"}], "chat_template_kwargs": {"x": 1}}),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]}, "/v1/chat/completions",
     {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]}),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "/v1/chat/completions", None),  # an image's blocks are hashed with the image
    ({"messages": MESSAGES, "cache_salt": "team-a"}, "/v1/chat/completions", None),
    ({"messages": []}, "/v1/chat/completions", None),
    ({"prompt": "the quick"}, COMPLETION, {"prompt": "the quick", "add_special_tokens": True}),
    ({"prompt": ["the quick"], "add_special_tokens": False}, COMPLETION, {"prompt": "the quick", "add_special_tokens": False}),
    ({"prompt": [5, 6, 7]}, COMPLETION, [5, 6, 7]),
    ({"prompt": [[5, 6, 7]]}, COMPLETION, [5, 6, 7]),
    ({"prompt": ["a", "b"]}, COMPLETION, None),  # a batch of prompts: no one answer
    ({"input": "hi"}, "/v1/responses", None),
], ids=["chat", "chat-template-fields", "text-parts", "image", "salt", "no-messages", "prompt", "prompt-list",
        "token-ids", "nested-token-ids", "prompt-batch", "responses"])
def test_tokenize_request(body: dict[str, Any], path: str, sent: object) -> None:
    assert tokenize_request(body, path) == sent


# -- the subscriber, against the emulated publisher -----------------------------------------------

class Engine:
    """One launch of the emulated engine and what the view's link says about it."""

    def __init__(self, folder: Path, name: str, buffer_steps: int = 100) -> None:
        self.link = EngineLink(f"ipc://{folder}/{name}.events", f"ipc://{folder}/{name}.replay",
                               "http://127.0.0.1:9")  # no /tokenize there: token-id prompts need none
        self.publisher = KvEventPublisher(self.link.events, str(self.link.replay), buffer_steps)


@pytest.fixture
async def folder(tmp_path: Path) -> AsyncIterator[Path]:
    short = Path("/tmp") / f"kvt-{tmp_path.name[-12:]}"  # unix socket paths must be short
    short.mkdir(exist_ok=True)
    yield short
    for p in short.iterdir():
        p.unlink()
    short.rmdir()


async def until(predicate: Any, what: str) -> None:
    for _ in range(500):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(what)


async def matched(view: KvEventsCache, tokens: list[int] = TOKENS) -> int | None:
    return await view.matched_tokens({"prompt": tokens}, COMPLETION)


async def eventually(view: KvEventsCache, expected: int | None) -> None:
    for _ in range(500):
        if await matched(view) == expected:
            return
        await asyncio.sleep(0.01)
    assert await matched(view) == expected


async def test_a_late_subscriber_replays_what_it_missed_and_a_lost_batch_is_replayed(folder: Path) -> None:
    engine = Engine(folder, "a")
    current: list[EngineLink | None] = [engine.link]
    view = KvEventsCache(lambda: current[0], poll_seconds=0.02)
    try:
        await engine.publisher.publish(stored([11, 12], None, TOKENS[:8], B))  # before the view subscribed
        assert await matched(view) is None  # not subscribed: cannot tell
        await view.start()
        await until(lambda: view.answering, "the view never caught up")
        assert await matched(view) == 8
        await engine.publisher.publish(stored([13], 12, TOKENS[8:12], B), drop=True)  # lost on the way
        replays = engine.publisher.replays
        await engine.publisher.publish(removed([99]))  # the next one shows the gap
        await eventually(view, 12)
        assert engine.publisher.replays == replays + 1 and view.answering
        await engine.publisher.publish(removed([12]))
        await eventually(view, 4)
        current[0] = None  # the engine restarts: no answer while it does not serve
        assert await matched(view) is None
        relaunched = Engine(folder, "b")
        current[0] = relaunched.link  # the new launch holds nothing
        await until(lambda: view.answering, "the view never followed the new launch")
        assert await matched(view) == 0
        await relaunched.publisher.publish(stored([21], None, TOKENS[:4], B))
        await eventually(view, 4)
        await relaunched.publisher.close()
    finally:
        await view.stop()
        await engine.publisher.close()


async def test_a_batch_the_replay_no_longer_has_makes_the_view_distrust_itself(folder: Path) -> None:
    engine = Engine(folder, "c", buffer_steps=1)
    view = KvEventsCache(lambda: engine.link, poll_seconds=0.02)
    try:
        await view.start()
        await until(lambda: view.answering, "the view never caught up")
        await engine.publisher.publish(stored([11, 12], None, TOKENS[:8], B))
        await eventually(view, 8)
        await engine.publisher.publish(removed([12]), drop=True)  # lost, and pushed out of the 1-batch buffer
        await engine.publisher.publish(removed([98]), drop=True)
        await engine.publisher.publish(removed([99]))
        await eventually(view, None)  # it may still hold block 12 or not: the router uses its own guess
        assert not view.answering
        await engine.publisher.publish(CLEARED, stored([11], None, TOKENS[:4], B))  # the engine empties its cache
        await eventually(view, 4)
    finally:
        await view.stop()
        await engine.publisher.close()


async def test_tokenizing_that_fails_answers_none(folder: Path) -> None:
    engine = Engine(folder, "d")
    view = KvEventsCache(lambda: engine.link, poll_seconds=0.02, tokenize_timeout=1.0)
    try:
        await view.start()
        await until(lambda: view.answering, "the view never caught up")
        chat = {"messages": MESSAGES}
        assert await view.matched_tokens(chat, "/v1/chat/completions") == 0  # holds nothing: no need to ask
        await engine.publisher.publish(stored([11], None, TOKENS[:4], B))
        await eventually(view, 4)
        assert await view.matched_tokens(chat, "/v1/chat/completions") is None  # nothing listens on port 9
        assert await view.tokens(chat, "/v1/chat/completions") is None
        assert view.matched(TOKENS) == 4  # tokens from elsewhere (another replica's /tokenize) still match here
    finally:
        await view.stop()
        await engine.publisher.close()


def test_the_emulated_batch_is_what_vllm_sends() -> None:
    """The emulator's frames decode with the view's own types, unknown fields (kv_cache_spec_kind) ignored."""
    payload = msgspec.msgpack.encode([1.0, [stored([1], None, [1, 2], 2), removed([1]), CLEARED], 0])
    decoded = msgspec.msgpack.Decoder(KVEventBatch).decode(payload)
    assert [type(e) for e in decoded.events] == [BlockStored, BlockRemoved, AllBlocksCleared]
