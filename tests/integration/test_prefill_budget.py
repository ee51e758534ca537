"""The prefill budget and the kept slot in a real gateway relaying to the emulator, whose first token
comes 1 ms per prompt word later (issue 32, item 8): with `prefill_budget_tokens: 1000`, a 900-token
prompt against steady 300-token traffic started only once the traffic stopped (12 s and more), and its
flow's next request with it; a slot kept for a flow that has left stayed idle until something arrived."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.emulators.fixture import RunningEmulator, running_emulator
from tests.gateway_process import RunningGateway, gateway
from tests.integration.test_abandoned_requests import metric, until
from tests.integration.test_scheduling import FLOW, Outcome, stream

pytestmark = pytest.mark.integration
TRAFFIC_S = 12.0
EVERY_S = 0.12


@pytest.fixture(scope="module")
def upstream() -> Iterator[RunningEmulator]:
    with running_emulator("vllm", "--tokens", "100000", "--itl-ms", "20", "--prefill-ms-per-token", "1",
                          "--max-model-len", "200000") as emu:
        yield emu


@pytest.fixture(scope="module")
def gw(upstream: RunningEmulator) -> Iterator[RunningGateway]:
    relay = f'engine: openai\n    options: {{base_url: "{upstream.url}", upstream_model: emulated-model, max_concurrency: SLOTS}}'
    config = ("models:\n"
              "  - source: remote\n    name: budget\n    max_queue: 64\n"
              "    scheduler: {prefill_budget_tokens: 1000, newcomer_slots: 0}\n"
              f"    {relay.replace('SLOTS', '16')}\n"
              "  - source: remote\n    name: kept\n    max_queue: 16\n"
              "    scheduler: {flow_window_seconds: 1}\n"
              f"    {relay.replace('SLOTS', '4')}\n")
    with gateway(config_yaml=config) as running:
        yield running


def prompt(tokens: int) -> str:
    """About `tokens` by the gateway's estimate (4 characters a token, 4 for the message) and the emulator's (words)."""
    return "abc " * (tokens - 4)


def chat(model: str, tokens: int, max_tokens: int = 3) -> dict[str, object]:
    return {"model": model, "stream": True, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": prompt(tokens)}]}


def ttft(o: Outcome) -> float:
    assert o.status == 200 and o.first is not None
    return o.first - o.sent


async def test_a_prompt_just_under_the_budget_starts_against_steady_shorter_traffic(gw: RunningGateway) -> None:
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0), limits=httpx.Limits(max_connections=200)) as http:
        await stream(http, gw.url, chat("budget", 10), {})  # warm
        chats: list[asyncio.Task[Outcome]] = []
        doc = doc_next = None
        began = time.monotonic()
        for i in range(int(TRAFFIC_S / EVERY_S)):  # a 300-token chat every 120 ms from four clients
            chats.append(asyncio.create_task(stream(http, gw.url, chat("budget", 300), {FLOW: f"chat{i % 4}"})))
            if doc is None and time.monotonic() - began >= 1.0:
                doc = asyncio.create_task(stream(http, gw.url, chat("budget", 900), {FLOW: "batch"}))
                await asyncio.sleep(0.01)
                doc_next = asyncio.create_task(stream(http, gw.url, chat("budget", 100), {FLOW: "batch"}))
            await asyncio.sleep(max(0.0, began + (i + 1) * EVERY_S - time.monotonic()))
        assert doc is not None and doc_next is not None
        done = await asyncio.gather(*chats)
        doc_out, next_out = await doc, await doc_next
    chat_ttft = sorted(ttft(o) for o in done)
    print(f"\n900-token prompt TTFT {ttft(doc_out):.2f} s, its flow's next {ttft(next_out):.2f} s; "
          f"300-token chats: {len(done)}, TTFT p50 {statistics.median(chat_ttft):.2f} s, "
          f"p90 {chat_ttft[int(0.9 * len(chat_ttft))]:.2f} s, max {chat_ttft[-1]:.2f} s")
    # before: neither started until the traffic stopped, 11 s after the document arrived
    assert ttft(doc_out) < 4.0 and ttft(next_out) < 4.0


async def test_a_slot_kept_for_a_flow_that_left_is_handed_out_without_new_arrivals(gw: RunningGateway) -> None:
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as http:
        await stream(http, gw.url, chat("kept", 10), {FLOW: "B"})  # B used the replica: one slot is kept for it
        a = [asyncio.create_task(stream(http, gw.url, chat("kept", 10, max_tokens=100000), {FLOW: "A"}))
             for _ in range(6)]
        await until(lambda: _value(http, gw.url, "enginegate_queue_waiting", 3), "A's burst queued")
        assert metric((await http.get(gw.url + "/metrics")).text, "enginegate_generations_running", model="kept") == 3
        # nothing arrives and nothing ends; B's window (1 s) lapses and A's next request takes the slot
        await until(lambda: _value(http, gw.url, "enginegate_generations_running", 4), "the kept slot handed out", 10)
        for t in a:
            t.cancel()
        await asyncio.gather(*a, return_exceptions=True)


async def _value(http: httpx.AsyncClient, url: str, name: str, value: float) -> bool:
    return metric((await http.get(url + "/metrics")).text, name, model="kept") == value
