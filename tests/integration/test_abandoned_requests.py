"""A client that gives up on a non-streaming request stops its work: in-process (the running
generation stops, queued requests leave the queue) and relayed (the upstream request is closed).
The engines' own counters say so. Real gateway processes, the real llama.cpp, the emulator."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Iterator

import httpx
import pytest

from tests.emulators.fixture import RunningEmulator, running_emulator
from tests.gateway_process import RunningGateway, gateway

pytestmark = pytest.mark.integration

MAX_TOKENS = 3000
# SmolLM2's end tokens (<|endoftext|>, <|im_end|>) made impossible: it generates until max_tokens
NO_END = {"0": -100, "2": -100}


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in a Prometheus exposition (0 when absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def until(predicate: Callable[[], Awaitable[bool]], what: str, bound: float = 120.0) -> None:
    deadline = time.monotonic() + bound
    while not await predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        await asyncio.sleep(0.1)


async def scrape(http: httpx.AsyncClient, url: str) -> str:
    return (await http.get(url + "/metrics")).text


@pytest.fixture(scope="module")
def in_process() -> Iterator[RunningGateway]:
    config = "models:\n  - source: default\n    name: smollm\n    engine: llamacpp\n    max_queue: 2\n    threads: 1\n"
    with gateway(config_yaml=config) as running:
        yield running


async def test_abandoned_in_process_requests_stop_generating_and_leave_the_queue(in_process: RunningGateway) -> None:
    url = in_process.url
    body = {"model": "smollm", "messages": [{"role": "user", "content": "Tell me a very long story."}],
            "max_tokens": MAX_TOKENS, "logit_bias": NO_END, "temperature": 0}
    async with httpx.AsyncClient(timeout=None) as http:
        before = await scrape(http, url)
        tokens_before = metric(before, "enginegate_engine_generation_tokens", model="smollm")
        clients = [asyncio.create_task(http.post(url + "/v1/chat/completions", json=body)) for _ in range(3)]

        async def one_running_two_queued() -> bool:
            assert not any(c.done() for c in clients), [c.result().text for c in clients if c.done()]
            text = await scrape(http, url)
            return (metric(text, "enginegate_generations_running", model="smollm") == 1
                    and metric(text, "enginegate_queue_waiting", model="smollm") == 2)

        await until(one_running_two_queued, "one generation running and two queued")
        # a fourth client finds the queue full
        assert (await http.post(url + "/v1/chat/completions", json=body)).status_code == 429
        for client in clients:  # the clients give up: their connections close
            client.cancel()
        await asyncio.gather(*clients, return_exceptions=True)

        async def idle() -> bool:
            text = await scrape(http, url)
            return (metric(text, "enginegate_engine_requests_running", model="smollm") == 0
                    and metric(text, "enginegate_engine_requests_waiting", model="smollm") == 0
                    and metric(text, "enginegate_queue_waiting", model="smollm") == 0
                    and metric(text, "enginegate_generations_running", model="smollm") == 0)

        await until(idle, "the engine to stop working for clients that left")
        after = await scrape(http, url)
        generated = metric(after, "enginegate_engine_generation_tokens", model="smollm") - tokens_before
        assert generated < MAX_TOKENS, f"{generated} tokens generated for clients that had left"
        assert metric(after, "enginegate_client_disconnects_total", model="smollm") == 3
        assert metric(after, "enginegate_requests_total", route="/v1/chat/completions", model="smollm", status="499") == 3
        # the engine is free for the next client at once
        small = {**body, "max_tokens": 2}
        response = await http.post(url + "/v1/chat/completions", json=small)
        assert response.status_code == 200, response.text
        assert "Traceback" not in in_process.log()


@pytest.fixture(scope="module")
def upstream() -> Iterator[RunningEmulator]:
    # 1000000 tokens 1 ms apart: a non-streaming answer that would take 1000 s
    with running_emulator("vllm", "--tokens", "1000000", "--itl-ms", "1", "--max-model-len", "2000000",
                           "--metrics") as emu:
        yield emu


@pytest.fixture(scope="module")
def relayed(upstream: RunningEmulator) -> Iterator[RunningGateway]:
    config = ("models:\n  - source: remote\n    name: relayed\n    engine: openai\n"
              f"    options: {{base_url: \"{upstream.url}\", upstream_model: emulated-model}}\n")
    with gateway(config_yaml=config) as running:
        yield running


async def test_abandoned_relayed_request_closes_the_upstream_request(upstream: RunningEmulator, relayed: RunningGateway) -> None:
    body = {"model": "relayed", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000000}
    async with httpx.AsyncClient(timeout=None) as http:

        async def running() -> float:
            return metric(await scrape(http, upstream.url), "vllm:num_requests_running")

        client = asyncio.create_task(http.post(relayed.url + "/v1/chat/completions", json=body))

        async def started() -> bool:
            assert not client.done(), client.result().text
            return await running() == 1.0

        await until(started, "the engine to run the request")
        client.cancel()
        await asyncio.gather(client, return_exceptions=True)
        await until(lambda: _equals(running(), 0.0), "the engine to see the request closed", bound=30)
        text = await scrape(http, relayed.url)
        assert metric(text, "enginegate_client_disconnects_total", model="relayed") == 1
        # nothing was generated to the end: the engine counted no finished request
        assert metric(await scrape(http, upstream.url), "vllm:request_success_total") == 0
        assert re.search(r"client disconnected before the response", relayed.log())


async def _equals(value: Awaitable[float], expected: float) -> bool:
    return await value == expected
