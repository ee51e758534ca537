"""SIGTERM with streams in flight: the gateway stops admitting (503 + Retry-After, /ready 503),
lets what can finish within the grace period finish, ends each remaining stream with an error
event, then exits. A real gateway process relaying to the emulator."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator

import httpx
import orjson
import pytest

from tests.emulators.fixture import RunningEmulator, running_emulator
from tests.gateway_process import RunningGateway, gateway

pytestmark = pytest.mark.integration
GRACE = 3.0


@pytest.fixture
def upstream() -> Iterator[RunningEmulator]:
    with running_emulator("vllm", "--tokens", "100000", "--itl-ms", "20", "--max-model-len", "200000") as emu:
        yield emu


@pytest.fixture
def relayed(upstream: RunningEmulator) -> Iterator[RunningGateway]:
    config = (f"shutdown_grace_seconds: {GRACE}\nretry_after_seconds: 7\n"
              "models:\n  - source: remote\n    name: relayed\n    engine: openai\n"
              f"    options: {{base_url: \"{upstream.url}\", upstream_model: emulated-model}}\n")
    with gateway(config_yaml=config) as running:
        yield running


def chat(max_tokens: int) -> dict[str, object]:
    return {"model": "relayed", "stream": True, "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}]}


async def stream_events(http: httpx.AsyncClient, url: str, max_tokens: int, started: asyncio.Event) -> list[bytes]:
    """Every `data:` payload of one stream, in order; `started` is set at the first one."""
    payloads: list[bytes] = []
    async with http.stream("POST", url + "/v1/chat/completions", json=chat(max_tokens)) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                payloads.append(line[6:].encode())
                started.set()
    return payloads


async def test_sigterm_drains_then_ends_the_remaining_streams(relayed: RunningGateway) -> None:
    url = relayed.url
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as http:
        starts = [asyncio.Event() for _ in range(3)]
        # two streams that would run for ~30 minutes, one that needs ~1 s: within the grace period
        streams = [asyncio.create_task(stream_events(http, url, n, s)) for n, s in zip((90000, 90000, 40), starts)]
        await asyncio.wait_for(asyncio.gather(*(s.wait() for s in starts)), 60)
        sigterm_at = time.monotonic()
        os.kill(relayed.process.pid, signal.SIGTERM)

        ready = await http.get(url + "/ready")
        assert ready.status_code == 503 and ready.json()["status"] == "draining"
        refused = await http.post(url + "/v1/chat/completions", json={**chat(2), "stream": False})
        assert refused.status_code == 503 and refused.headers["retry-after"] == "7"
        assert refused.json()["error"]["code"] == "shutting_down"
        assert (await http.get(url + "/health")).status_code == 200

        long_a, long_b, short = await asyncio.wait_for(asyncio.gather(*streams), 60)
        ended_after = time.monotonic() - sigterm_at

    assert short[-1] == b"[DONE]" and not any(b'"error"' in p for p in short)  # finished within the grace
    for events in (long_a, long_b):
        assert events[-1] != b"[DONE]"
        error = orjson.loads(events[-1])["error"]
        assert "shutting down" in error["message"] and error["type"] == "service_unavailable_error"
        assert len(events) > 10  # they streamed until the grace period ended
    assert ended_after >= GRACE * 0.9, "streams were ended before the grace period"
    assert relayed.process.wait(timeout=60) in (0, -signal.SIGTERM)
    log = relayed.log()
    assert "drain grace over: ending 2 request(s)" in log and "Application shutdown complete" in log
    assert "Traceback" not in log


async def test_idle_gateway_exits_at_once_on_sigterm(relayed: RunningGateway) -> None:
    os.kill(relayed.process.pid, signal.SIGTERM)
    assert relayed.process.wait(timeout=60) in (0, -signal.SIGTERM)
    assert "drained" in relayed.log() and "drain grace over" not in relayed.log()
