"""Responses and Anthropic Messages through the relay (engine `openai`) to an OpenAI-compatible upstream:
the engine emulator in vLLM's style, a real process, driven by the official clients."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anthropic
import openai
import pytest
import pytest_asyncio

from adapters import registry
from adapters.config import EngineConfig
from gateway.app import create_app
from gateway.config import Settings
from gateway.routing import Admission, Backend, ModelRegistry
from gateway.runtime import Runtime
from tests.emulators.fixture import RunningEmulator, running_emulator
from tests.gateway_process import app_server

pytestmark = pytest.mark.integration
KEY = "sk-upstream"
TEXT = "tok0 tok1 tok2 tok3"


@pytest.fixture(scope="module")
def emu() -> Iterator[RunningEmulator]:
    with running_emulator("vllm", "--api-key", KEY, "--tokens", "4") as e:
        yield e


@pytest.fixture(scope="module")
def crashing() -> Iterator[RunningEmulator]:
    with running_emulator("vllm", "--api-key", KEY, "--tokens", "6", "--error-after-tokens", "2") as e:
        yield e


def backend(emu: RunningEmulator, name: str) -> Backend:
    opts = {"base_url": emu.base_url, "api_key": KEY, "upstream_model": "emulated-model"}
    adapter = registry.create("openai", EngineConfig(source="remote", name=name, options=opts))
    return Backend(model_id=name, adapter=adapter, admission=Admission(8, 16))


@pytest_asyncio.fixture
async def gateway_url(emu: RunningEmulator, crashing: RunningEmulator, tmp_path: Path) -> AsyncIterator[str]:
    models = ModelRegistry()
    models.add(backend(emu, "remote"))
    models.add(backend(crashing, "crashing"))
    settings = Settings(response_store={"path": tmp_path / "r.sqlite3"})
    async with app_server(create_app(settings, Runtime(settings=settings, models=models))) as url:
        yield url


async def test_messages_through_the_relay(gateway_url: str) -> None:
    claude = anthropic.AsyncAnthropic(base_url=gateway_url, api_key="x", max_retries=0)
    ask = [{"role": "user", "content": "a b"}]
    msg = await claude.messages.create(model="remote", max_tokens=10, messages=ask)  # type: ignore[arg-type]
    assert msg.content[0].text == TEXT and msg.usage.output_tokens == 4 and msg.usage.input_tokens == 2  # type: ignore[union-attr]
    async with claude.messages.stream(model="remote", max_tokens=10, messages=ask) as stream:  # type: ignore[arg-type]
        text = "".join([t async for t in stream.text_stream])
        final = await stream.get_final_message()
    assert text == TEXT and final.usage.output_tokens == 4 and final.stop_reason == "end_turn"
    # the upstream's own 400 (context too long) leaves in Anthropic's shape
    with pytest.raises(anthropic.BadRequestError, match="maximum context length") as info:
        await claude.messages.create(model="remote", max_tokens=5000, messages=ask)  # type: ignore[arg-type]
    assert info.value.body["type"] == "error"  # type: ignore[index]


async def test_responses_through_the_relay_with_state(gateway_url: str) -> None:
    client = openai.AsyncOpenAI(base_url=gateway_url + "/v1", api_key="x", max_retries=0)
    first = await client.responses.create(model="remote", input="a b")
    assert first.output_text == TEXT and first.usage is not None and first.usage.output_tokens == 4
    stream = await client.responses.create(model="remote", input="c", previous_response_id=first.id, stream=True)
    events = [e async for e in stream]
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    second = events[-1].response  # type: ignore[union-attr]
    assert second.output_text == TEXT and second.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens  # the stored history went upstream
    assert (await client.responses.retrieve(second.id)).previous_response_id == first.id


async def test_upstream_failure_mid_stream_ends_each_stream_cleanly(gateway_url: str) -> None:
    claude = anthropic.AsyncAnthropic(base_url=gateway_url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.APIStatusError):
        async with claude.messages.stream(model="crashing", max_tokens=10,
                                          messages=[{"role": "user", "content": "a"}]) as stream:  # type: ignore[list-item]
            async for _ in stream:
                pass
    client = openai.AsyncOpenAI(base_url=gateway_url + "/v1", api_key="x", max_retries=0)
    events = [e async for e in await client.responses.create(model="crashing", input="a", stream=True)]
    assert [e.type for e in events][-2:] == ["error", "response.failed"]
