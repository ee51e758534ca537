"""A shared upstream's load as its engine counts it (`options.engine_metrics`), against a real emulator process
(llama-server's metrics): another client's running request counts, which is what lets gateways in front of the
same replicas bound them alike (gateway/routing/balancer.py `bound`). Unset, the gateway knows only its own."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from adapters import registry
from adapters.config import EngineConfig
from adapters.external import ExternalAdapter
from adapters.process import free_port
from tests.emulators.fixture import running_emulator

pytestmark = pytest.mark.integration


def external(url: str, **options: object) -> ExternalAdapter:
    adapter = registry.create("openai", EngineConfig(source="remote", name="emulated-model",
                                                     options={"base_url": url, **options}))
    assert isinstance(adapter, ExternalAdapter)
    return adapter


async def test_another_clients_request_counts_in_the_upstreams_load() -> None:
    with running_emulator("llamacpp", "--metrics", "--parallel", "2", "--tokens", "100000", "--itl-ms", "20") as emu:
        named, unnamed = external(emu.url, engine_metrics="llama_server"), external(emu.url)
        try:
            idle = await named.engine_stats()
            assert idle is not None and idle.requests_running == 0
            body = {"model": "emulated-model", "stream": True, "max_tokens": 400,
                    "messages": [{"role": "user", "content": "hello"}]}
            async with httpx.AsyncClient(timeout=60) as other, \
                    other.stream("POST", emu.base_url + "/chat/completions", json=body) as response:
                async for _ in response.aiter_lines():
                    break  # the other client's request is under way
                busy = await named.engine_stats()
                assert busy is not None and busy.requests_running == 1
                assert await unnamed.engine_stats() is None
        finally:
            await asyncio.gather(named.stop(), unnamed.stop())


def test_an_engine_without_metrics_or_unknown_is_a_configuration_error() -> None:
    with pytest.raises(ValueError, match="must name an engine"):
        external("http://127.0.0.1:9", engine_metrics="nonesuch")
    with pytest.raises(ValueError, match="must name an engine"):
        external("http://127.0.0.1:9", engine_metrics=3)


async def test_an_upstream_that_does_not_answer_has_no_load_never_an_error() -> None:
    adapter = external(f"http://127.0.0.1:{free_port()}", engine_metrics="vllm")
    try:
        assert await adapter.engine_stats() is None
    finally:
        await adapter.stop()
