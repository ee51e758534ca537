"""Issue 38, item 1, in front of the vLLM and SGLang emulators (engines that cannot run here): a real
gateway process with the scheduler's defaults relays to an emulator with 2 generation slots
(`--parallel 2`). team-a floods 40 streams; team-b, seen before, sends one short request: none of
team-a's is refused (its own queue of 64), and team-b's first token comes before any of team-a's
streams ends (it starts in the slot kept for it, not after a flood stream)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from tests.emulators.fixture import running_emulator
from tests.gateway_process import RunningGateway, gateway
from tests.integration.test_scheduling import FLOW, chat, stream

pytestmark = pytest.mark.integration
FLOOD = 40


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def relayed(request: pytest.FixtureRequest) -> Iterator[RunningGateway]:
    with running_emulator(request.param, "--tokens", "100000", "--itl-ms", "20", "--parallel", "2") as emu:
        config = ("models:\n  - source: remote\n    name: pair\n    engine: openai\n"
                  f'    options: {{base_url: "{emu.url}", upstream_model: emulated-model, max_concurrency: 2}}\n')
        with gateway(config_yaml=config) as running:
            yield running


async def test_a_40_stream_flood_queues_and_its_neighbour_does_not_wait_for_it(relayed: RunningGateway) -> None:
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as http:
        await stream(http, relayed.url, chat("pair", 2), {FLOW: "team-b"})
        a = [asyncio.create_task(stream(http, relayed.url, chat("pair", 20), {FLOW: "team-a"})) for _ in range(FLOOD)]
        await asyncio.sleep(0.3)
        b = await stream(http, relayed.url, chat("pair", 5), {FLOW: "team-b"})
        flood = await asyncio.gather(*a)
    assert [o.status for o in flood] == [200] * FLOOD  # the excess waited in team-a's own queue
    assert b.status == 200 and b.first is not None
    ended = [o for o in flood if o.end is not None and b.sent < o.end < b.first]
    assert not ended, f"team-b waited for {len(ended)} of team-a's streams to end"
