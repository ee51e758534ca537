"""Precise mode as a user runs it: one gateway serving a model on two vLLM-CPU replicas that publish
their KV cache events (`options.kv_events: true`), routed by the default policy (`affinity: cache`),
talked to through the official `openai` client.

Each replica's events view (gateway/cache_routing/kv_events.py) tells the router how many tokens of a
prompt its engine holds; the tests check the router's choice (/metrics), what it believed
(`Placement.precise_tokens`) and what the engine says it reused (`cached_tokens`) agree: a
conversation returns to the replica holding it, a new one is placed by cost, and after one engine is
killed its restarted view holds nothing, so its conversation is placed again, cold, not by habit.

One gateway for the module (two vLLM-CPU engines start in parallel, minutes here), the tiny
random-weight llama of tests/engines/tiny_model.py, 32-token blocks, short prompts, 2-token answers.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from adapters.process import ProcessState
from gateway.app import create_app
from gateway.cache_routing.kv_events import KvEventsCache
from gateway.cache_routing.tracker import Placement
from gateway.config import ModelConfig, Settings
from gateway.routing import Backend
from gateway.routing.pool import Replica
from tests.engines.precise import BLOCK, answering, kv_events_vllm
from tests.gateway_process import app_server

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]
SERVED = "tiny-precise"
CHAT = "/v1/chat/completions"
# different from their first character: the two conversations share only the chat template's opening
FIRST = "the quick brown fox jumps over the lazy dog. " * 5
SECOND = "a gateway serves many engines behind one openai api. " * 5


@dataclass
class Served:
    http: httpx.AsyncClient
    client: openai.AsyncOpenAI
    backend: Backend
    placements: list[tuple[str, Placement]] = field(default_factory=list)
    """Every placement the router chose, with its replica's name, in order."""
    start_seconds: float = 0.0
    first: list[dict[str, str]] = field(default_factory=list)
    """The first conversation's messages so far (the tests below run in order, on one gateway)."""
    second: list[dict[str, str]] = field(default_factory=list)


def spy(served: Served, replica: Replica) -> None:
    """Record each placement the router commits to on this replica (what it believed the engine held)."""
    cache = served.backend.cache_of(replica)
    chosen = cache.chosen

    def record(placement: Placement) -> None:
        served.placements.append((replica.name, placement))
        chosen(placement)

    cache.chosen = record  # type: ignore[method-assign]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    model, options = kv_events_vllm(tmp_path_factory.mktemp("vllm-precise"), context_length=512)
    settings = Settings(models=(ModelConfig(source=str(model), name=SERVED, engine="vllm", replicas=2,
                                            options=options, embeddings=False,
                                            routing={"health_interval_seconds": 0.2}),))
    app = create_app(settings)
    started = time.monotonic()
    async with app_server(app) as url, httpx.AsyncClient(base_url=url, timeout=300) as http:
        start_seconds = time.monotonic() - started
        print(f"\ntwo vLLM-CPU replicas started in parallel in {start_seconds:.0f}s")
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", timeout=300, max_retries=0)
        backend = app.state.runtime.models.get(SERVED)
        assert backend.routing.affinity == "cache"  # the default over several replicas
        result = Served(http, client, backend, start_seconds=start_seconds)
        for replica in backend.replicas:
            spy(result, replica)
        for replica in backend.replicas:
            await answering(view(replica))
        try:
            yield result
        finally:
            await client.close()


def view(replica: Replica) -> KvEventsCache:
    cache = replica.cache
    assert cache is not None and isinstance(cache.precise, KvEventsCache)  # kv_events: true gave it a view
    return cache.precise


async def decisions(http: httpx.AsyncClient) -> dict[tuple[str, str], float]:
    """enginegate_routing_decisions_total by (replica, reason), for this model."""
    text = (await http.get("/metrics")).text
    return {(s.labels["replica"], s.labels["reason"]): s.value
            for family in text_string_to_metric_families(text) if family.name == "enginegate_routing_decisions"
            for s in family.samples if s.name.endswith("_total") and s.labels.get("model") == SERVED}


@dataclass(frozen=True)
class Turn:
    replica: str
    reason: str
    precise_tokens: int | None
    prompt_tokens: int
    cached_tokens: int


async def say(served: Served, messages: list[dict[str, str]], text: str) -> Turn:
    """One turn through the gateway: where it went and why, what the router believed the engine held
    there, and what the engine reports it reused. The views are let catch up with the engine's
    events of the turn first (they follow the response by one engine step)."""
    messages.append({"role": "user", "content": text})
    before, placed = await decisions(served.http), len(served.placements)
    reply = await served.client.chat.completions.create(model=SERVED, messages=messages,  # type: ignore[arg-type]
                                                        max_tokens=2, temperature=0)
    messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
    after = await decisions(served.http)
    moved = [key for key, value in after.items() if value > before.get(key, 0.0)]
    assert len(moved) == 1, moved
    assert len(served.placements) > placed
    name, placement = served.placements[-1]
    assert name == moved[0][0]
    usage = reply.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    turn = Turn(name, moved[0][1], placement.precise_tokens, usage.prompt_tokens,
                int(usage.prompt_tokens_details.cached_tokens or 0))
    await settled(served, name, messages[:-1])
    return turn


async def settled(served: Served, name: str, prompt: list[dict[str, str]]) -> None:
    """Wait until the replica's view holds the whole blocks of the prompt it just served."""
    events = view(replica_named(served.backend, name))
    tokens = await events.tokens({"messages": prompt}, CHAT)
    assert tokens is not None
    whole = (len(tokens) - 1) // BLOCK * BLOCK  # the last prompt token is always computed
    for _ in range(100):
        if (events.matched(tokens) or 0) >= whole:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"replica {name}'s view never showed the {whole} tokens it just computed")


def replica_named(backend: Backend, name: str) -> Replica:
    return next(r for r in backend.replicas if r.name == name)


async def holds(served: Served, messages: list[dict[str, str]], text: str) -> dict[str, int | None]:
    """What each replica's view says its engine holds of the conversation's next prompt."""
    events = [view(r) for r in served.backend.replicas]
    tokens = await events[0].tokens({"messages": [*messages, {"role": "user", "content": text}]}, CHAT)
    assert tokens is not None
    return {r.name: v.matched(tokens) for r, v in zip(served.backend.replicas, events, strict=True)}


async def test_a_conversation_returns_to_the_replica_whose_engine_holds_it(served: Served) -> None:
    opening = await say(served, served.first, FIRST)
    assert opening.reason == "cache_cold" and opening.precise_tokens == 0 and opening.cached_tokens == 0
    home = opening.replica
    held = await holds(served, served.first, "and then?")
    assert held[home] is not None and held[home] >= 2 * BLOCK  # type: ignore[operator]
    assert all(v == 0 for name, v in held.items() if name != home), held  # the other engine never saw it
    for text in ("and then?", "one more time?"):
        cache = replica_named(served.backend, home).cache
        assert cache is not None
        cached_before = cache.counts.cached_tokens
        turn = await say(served, served.first, text)
        assert (turn.replica, turn.reason) == (home, "cache_hit")
        assert turn.precise_tokens is not None and turn.precise_tokens >= 2 * BLOCK
        assert turn.precise_tokens == turn.cached_tokens, turn  # the view agrees with the engine
        assert turn.cached_tokens > turn.prompt_tokens // 2
        assert cache.counts.cached_tokens - cached_before == turn.cached_tokens  # the engine's report, here


async def test_a_new_conversation_goes_by_cost_past_the_busy_holder(served: Served) -> None:
    home = next(name for name, _ in served.placements)
    holder, other = replica_named(served.backend, home), next(r for r in served.backend.replicas if r.name != home)
    assert holder.admission.concurrency == 2  # --max-num-seqs 2: both leases below are admitted at once
    # two requests in flight at the replica holding the first conversation: over its bounded load
    leases = [await served.backend.acquire(None, exclude=[other]) for _ in range(2)]
    try:
        assert all(lease.replica is holder for lease in leases)
        opening = await say(served, served.second, SECOND)
    finally:
        for lease in leases:
            lease.release()
    assert (opening.replica, opening.reason) == (other.name, "cache_cold")  # nobody holds it: by load
    assert opening.precise_tokens == 0 and opening.cached_tokens == 0
    follow = await say(served, served.second, "and then?")  # both idle now: it goes where it is held
    assert (follow.replica, follow.reason) == (other.name, "cache_hit")
    assert follow.precise_tokens is not None and follow.precise_tokens == follow.cached_tokens > 0
    assert follow.cached_tokens > follow.prompt_tokens // 2
    again = await say(served, served.first, "still there?")  # and the first one still goes home
    assert (again.replica, again.reason) == (home, "cache_hit")


async def test_after_its_engine_is_killed_its_conversation_is_placed_again_cold(served: Served) -> None:
    home = next(name for name, _ in served.placements)
    victim = replica_named(served.backend, home)
    adapter: Any = victim.adapter
    next_text = "are you back?"
    held = await holds(served, served.first, next_text)
    assert (held[home] or 0) >= 2 * BLOCK
    restarts, pid = adapter.process.restarts, adapter.process.pid
    assert pid is not None
    os.killpg(pid, signal.SIGKILL)  # the engine dies with its KV cache
    for _ in range(9000):
        if (adapter.process.restarts > restarts and adapter.process.state is ProcessState.READY
                and victim.breaker.allows() and view(victim).answering):
            break
        await asyncio.sleep(0.1)
    assert adapter.process.state is ProcessState.READY, adapter.process.detail
    await answering(view(victim))
    held = await holds(served, served.first, next_text)
    assert held == {r.name: 0 for r in served.backend.replicas}, held  # the new launch holds nothing of it
    # the breaker's own probe closed it when the new launch was ready, with no request spent on a trial
    assert victim.breaker.state.value == "closed"
    other = await say(served, [], "a third conversation, placed like any other.")
    assert (other.reason, other.precise_tokens) == ("cache_cold", 0), other  # no replica holds it
    turn = await say(served, served.first, next_text)
    assert turn.reason == "cache_cold", turn  # placed by load, not sent back to its old home as a hit
    assert turn.precise_tokens == 0 and turn.cached_tokens == 0  # and the engine recomputed it all
    follow = await say(served, served.first, "good.")  # from there on it has a home again
    assert (follow.replica, follow.reason) == (turn.replica, "cache_hit")
    assert follow.precise_tokens is not None and follow.precise_tokens == follow.cached_tokens > 0
