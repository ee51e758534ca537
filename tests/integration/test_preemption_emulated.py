"""Preemption (issue 38, item 1) through a real gateway process in front of the vLLM and SGLang emulators,
which continue a final assistant message as those engines do (`continue_final_message`) and number their
tokens, so a resumed stream that lost or repeated anything would show it. Relayed as `engine: openai`, so
`scheduler.preempt: true` is set, as an operator fronting vLLM or SGLang that way would.

team-a's streams hold both slots (one borrowed: team-b used the replica before); team-b's request takes
the borrowed slot back at once; the cut stream resumes after it and its client sees one unbroken stream:
one id, one role, every token once, one finish, usage of its one request. Faults: team-a's clients give up
while one of them waits to resume (nothing leaks: the replica drains); the engine dies while a stream waits
to resume (its client gets an error event, never a hang)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest

from tests.emulators.fixture import RunningEmulator, running_emulator
from tests.gateway_process import RunningGateway, gateway
from tests.integration.test_abandoned_requests import metric, until

pytestmark = pytest.mark.integration
FLOW = "x-enginegate-flow"
MODEL = "pair"
TOKENS = 40
HANG_S = 120.0
"""Not a speed bound: how long the test waits before calling an answer that never comes a hang."""


def config(emu: RunningEmulator) -> str:
    return ("models:\n  - source: remote\n    name: pair\n    engine: openai\n    scheduler: {preempt: true}\n"
            f'    options: {{base_url: "{emu.url}", upstream_model: emulated-model, max_concurrency: 2}}\n')


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def relayed(request: pytest.FixtureRequest) -> Iterator[RunningGateway]:
    with running_emulator(request.param, "--tokens", "100000", "--itl-ms", "20", "--parallel", "2") as emu:
        with gateway(config_yaml=config(emu)) as running:
            yield running


@dataclass
class Stream:
    status: int = 0
    first: float | None = None
    end: float | None = None
    chunks: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    error: dict[str, Any] | None = None

    @property
    def text(self) -> str:
        return "".join(c["choices"][0].get("delta", {}).get("content") or c["choices"][0].get("text") or ""
                       for c in self.chunks if c.get("choices"))


async def run(http: httpx.AsyncClient, url: str, flow: str, tokens: int, out: Stream, route: str = "chat") -> None:
    if route == "chat":
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": "tell a story"}]}
    else:
        path, body = "/v1/completions", {"prompt": "Once upon a time"}
    body |= {"model": MODEL, "stream": True, "max_tokens": tokens, "ignore_eos": True,
             "stream_options": {"include_usage": True}}
    async with http.stream("POST", url + path, json=body, headers={FLOW: flow}) as response:
        out.status = response.status_code
        async for line in response.aiter_lines():
            if line == "data: [DONE]":
                out.done = True
            elif line.startswith("data: "):
                chunk = orjson.loads(line[6:])
                if "error" in chunk:
                    out.error = chunk["error"]
                    continue
                out.chunks.append(chunk)
                if out.first is None and out.text:
                    out.first = time.monotonic()
    out.end = time.monotonic()


def expected(tokens: int) -> str:
    return "".join(f"tok{i}" if i == 0 else f" tok{i}" for i in range(tokens))


def unbroken(s: Stream, tokens: int, route: str) -> None:
    """What a client of an uncut stream would have seen."""
    assert s.status == 200 and s.done and s.error is None
    assert len({c["id"] for c in s.chunks}) == 1 and len({c["created"] for c in s.chunks}) == 1
    if route == "chat":
        assert sum("role" in (c["choices"][0].get("delta") or {}) for c in s.chunks if c["choices"]) == 1
    assert s.text == expected(tokens)
    finishes = [c["choices"][0]["finish_reason"] for c in s.chunks if c["choices"] and c["choices"][0].get("finish_reason")]
    assert finishes == ["length"]
    usage = s.chunks[-1]["usage"]
    assert usage["completion_tokens"] == tokens and usage["total_tokens"] == usage["prompt_tokens"] + tokens


async def scrape(http: httpx.AsyncClient, gw: RunningGateway, name: str) -> float:
    return metric((await http.get(gw.url + "/metrics")).text, name, model=MODEL)


async def both_streaming(streams: list[Stream]) -> None:
    async def streaming() -> bool:
        return all(s.first is not None for s in streams)

    await until(streaming, "team-a's streams under way", HANG_S)


async def cut_one(http: httpx.AsyncClient, gw: RunningGateway, a_tokens: int, b_tokens: int
                  ) -> tuple[list[Stream], list[asyncio.Task[None]], Stream, asyncio.Task[None]]:
    """team-b (seen before) sends `b_tokens` while team-a's two streams of `a_tokens` hold both slots; returns once
    one of team-a's is cut: team-a's streams and tasks, team-b's stream and task."""
    before = await scrape(http, gw, "enginegate_scheduler_preemptions_total")
    await run(http, gw.url, "team-b", 2, Stream())
    a = [Stream(), Stream()]
    tasks = [asyncio.create_task(run(http, gw.url, "team-a", a_tokens, s)) for s in a]
    await both_streaming(a)
    b = Stream()
    b_task = asyncio.create_task(run(http, gw.url, "team-b", b_tokens, b))

    async def preempted() -> bool:
        return await scrape(http, gw, "enginegate_scheduler_preemptions_total") == before + 1

    await until(preempted, "one of team-a's streams preempted", HANG_S)
    return a, tasks, b, b_task


@pytest.mark.parametrize("route", ["chat", "completions"])
async def test_a_neighbour_takes_the_borrowed_slot_and_the_cut_stream_resumes_unbroken(
        relayed: RunningGateway, route: str) -> None:
    async with httpx.AsyncClient(timeout=httpx.Timeout(HANG_S)) as http:
        before = await scrape(http, relayed, "enginegate_scheduler_preemptions_total")
        await run(http, relayed.url, "team-b", 2, Stream())  # team-b used the replica: a slot is kept for it
        a = [Stream(), Stream()]
        tasks = [asyncio.create_task(run(http, relayed.url, "team-a", TOKENS, s, route)) for s in a]
        await both_streaming(a)  # team-a holds both slots, one of them borrowed
        b = Stream()
        await run(http, relayed.url, "team-b", 5, b, route)
        await asyncio.gather(*tasks)
        assert b.status == 200 and b.first is not None
        assert all(s.end is not None and s.end > b.first for s in a), "team-b waited for a stream of team-a's to end"
        for s in a:
            unbroken(s, TOKENS, route)
        assert await scrape(http, relayed, "enginegate_scheduler_preemptions_total") == before + 1


async def test_each_stream_is_cut_at_most_once(relayed: RunningGateway) -> None:
    """A neighbour's requests cost a flood at most one more prefill per stream, however many it sends."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(HANG_S)) as http:
        before = await scrape(http, relayed, "enginegate_scheduler_preemptions_total")
        await run(http, relayed.url, "team-b", 2, Stream())
        a = [Stream(), Stream()]
        tasks = [asyncio.create_task(run(http, relayed.url, "team-a", 100, s)) for s in a]
        await both_streaming(a)
        for _ in range(4):
            await run(http, relayed.url, "team-b", 3, Stream())
        await asyncio.gather(*tasks)
        cut = await scrape(http, relayed, "enginegate_scheduler_preemptions_total") - before
        assert 1 <= cut <= len(a)
        for s in a:
            unbroken(s, 100, "chat")


async def test_clients_that_give_up_while_one_waits_to_resume_leak_nothing(relayed: RunningGateway) -> None:
    async with httpx.AsyncClient(timeout=httpx.Timeout(HANG_S)) as http:
        _, tasks, _, b = await cut_one(http, relayed, 400, 100)  # team-b's ~2 s: team-a's cut one waits
        for t in tasks:
            t.cancel()  # one waits to resume, one streams
        await asyncio.gather(*tasks, return_exceptions=True)
        await b

        async def drained() -> bool:
            return (await scrape(http, relayed, "enginegate_queue_waiting"),
                    await scrape(http, relayed, "enginegate_generations_running")) == (0, 0)

        await until(drained, "the replica drained", HANG_S)
        again = [Stream(), Stream()]  # both slots are usable
        await asyncio.gather(*(run(http, relayed.url, "team-c", 3, s) for s in again))
        assert [s.text for s in again] == [expected(3)] * 2


async def test_sigterm_while_a_stream_waits_to_resume_still_finishes_it_within_the_grace() -> None:
    with running_emulator("vllm", "--tokens", "100000", "--itl-ms", "20", "--parallel", "2") as emu:
        with gateway(config_yaml=f"shutdown_grace_seconds: 60\n{config(emu)}") as gw:
            async with httpx.AsyncClient(timeout=httpx.Timeout(HANG_S)) as http:
                a, tasks, b, b_task = await cut_one(http, gw, 60, 30)
                os.kill(gw.process.pid, signal.SIGTERM)  # one stream waits to resume, two stream
                await asyncio.gather(*tasks, b_task)
            assert gw.process.wait(timeout=HANG_S) in (0, -signal.SIGTERM)
            for s in a:
                unbroken(s, 60, "chat")  # the cut one resumed while the gateway drained
            assert b.status == 200 and b.done and b.error is None
            assert "Traceback" not in gw.log()


async def test_an_engine_that_dies_while_a_stream_waits_to_resume_ends_it_with_an_error() -> None:
    with running_emulator("vllm", "--tokens", "100000", "--itl-ms", "20", "--parallel", "2") as emu:
        with gateway(config_yaml=config(emu)) as gw:
            async with httpx.AsyncClient(timeout=httpx.Timeout(HANG_S)) as http:
                a, tasks, b, b_task = await cut_one(http, gw, 400, 400)
                emu.stop()  # the engine dies: the cut stream's resume finds nothing
                await asyncio.wait_for(asyncio.gather(*tasks, b_task), HANG_S)
            for s in [*a, b]:
                assert s.status == 200 and (s.error is not None or not s.done)
            assert any(s.error is not None for s in a)  # the one waiting to resume is told, with the API's shape
            assert "Traceback" not in gw.log()
