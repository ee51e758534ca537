"""Several external-URL replicas behind one model name, each a real emulator process.

An upstream that answers every generation with 503 is retried elsewhere before the client sees
anything, its breaker opens, and it is skipped after that; an external URL has no gateway cap
unless one is configured.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.config import ModelConfig, Settings
from tests.emulators.fixture import RunningEmulator, running_emulator
from tests.gateway_process import app_server

pytestmark = pytest.mark.integration
CHAT = {"model": "remote", "messages": [{"role": "user", "content": "a b c"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def healthy() -> Iterator[RunningEmulator]:
    with running_emulator("vllm", "--model", "remote", "--tokens", "4", "--ttft-ms", "300") as emu:
        yield emu


@pytest.fixture(scope="module")
def failing() -> Iterator[RunningEmulator]:
    with running_emulator("vllm", "--model", "remote", "--fail-status", "503") as emu:
        yield emu


def settings(first: RunningEmulator, *others: RunningEmulator, routing: dict[str, Any] | None = None,
             **model: Any) -> Settings:
    backends = tuple({"engine": "openai", "options": {"base_url": emu.base_url}} for emu in others)
    model["options"] = {"base_url": first.base_url, **model.get("options", {})}
    return Settings(models=(ModelConfig(name="remote", engine="openai", backends=backends, routing=routing or {},
                                        **model),))


async def stats(http: httpx.AsyncClient) -> dict[str, Any]:
    return (await http.get("/v1/gateway/stats")).json()["models"]["remote"]  # type: ignore[no-any-return]


async def test_a_replica_answering_503_is_retried_elsewhere_then_skipped(failing: RunningEmulator,
                                                                         healthy: RunningEmulator) -> None:
    config = settings(failing, healthy, routing={"balance": "round_robin", "failure_threshold": 2, "open_seconds": 600})
    async with app_server(create_app(config)) as url, httpx.AsyncClient(base_url=url, timeout=60) as http:
        answers = [await http.post("/v1/chat/completions", json=CHAT) for _ in range(8)]
        assert [a.status_code for a in answers] == [200] * 8  # the client never saw the upstream's 503
        assert all(a.json()["choices"][0]["message"]["content"] == "tok0 tok1 tok2 tok3" for a in answers)
        model = await stats(http)
        bad, good = model["replicas"]
        assert bad["state"] == "open" and "EngineError" in bad["reason"] and bad["breaker_opens"] == 1
        assert good["state"] == "closed" and good["served"] == 8
        assert bad["failed"] == 2  # round robin sent it two requests; then the open breaker skipped it
        metrics = (await http.get("/metrics")).text
    assert 'enginegate_replica_retries_total{model="remote",replica="0"} 2.0' in metrics
    assert 'enginegate_replica_breaker_state{model="remote",replica="0",state="open"} 1.0' in metrics
    assert 'enginegate_replica_up{engine="openai",model="remote",replica="0"} 0.0' in metrics
    assert 'enginegate_routing_decisions_total{model="remote",reason="round_robin",replica="1"} 8.0' in metrics


async def test_without_retries_the_client_gets_the_engines_error(failing: RunningEmulator) -> None:
    config = settings(failing, failing, routing={"max_retries": 0})
    async with app_server(create_app(config)) as url, httpx.AsyncClient(base_url=url, timeout=60) as http:
        answer = await http.post("/v1/chat/completions", json=CHAT)
        assert answer.status_code == 503 and answer.json()["error"]["message"]


async def test_an_external_url_has_no_gateway_cap(healthy: RunningEmulator) -> None:
    """128 concurrent streams to one upstream: none refused (the old fixed cap of 64 + 16 queued answered 429)."""
    async with app_server(create_app(settings(healthy))) as url, httpx.AsyncClient(base_url=url, timeout=120) as http:
        async def one() -> int:
            async with http.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as resp:
                body = b"".join([chunk async for chunk in resp.aiter_bytes()])
                return resp.status_code if body.rstrip().endswith(b"[DONE]") else -1

        codes = await asyncio.gather(*(one() for _ in range(128)))
        assert codes == [200] * 128
        model = await stats(http)
        assert model["slots"] is None and model["replicas"][0]["slots_from"] == "none"


async def test_a_configured_cap_on_an_external_url_is_kept(healthy: RunningEmulator) -> None:
    config = settings(healthy, options={"max_concurrency": 2}, max_queue=0)
    async with app_server(create_app(config)) as url, httpx.AsyncClient(base_url=url, timeout=60) as http:
        codes = await asyncio.gather(*(http.post("/v1/chat/completions", json=CHAT) for _ in range(6)))
        assert sorted(c.status_code for c in codes) == [200, 200, 429, 429, 429, 429]
        assert (await stats(http))["replicas"][0]["slots_from"] == "user"
