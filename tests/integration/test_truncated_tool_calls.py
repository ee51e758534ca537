"""A forced tool call cut by the token limit says so on every API, streamed and not, on in-process llama.cpp
and on llama-server (the embedded SmolLM2, max_tokens 5): chat `finish_reason: "length"` (the openai SDK's
`LengthFinishReasonError`, which `parse()` and `stream()` raise), Responses `status: "incomplete"` with
`incomplete_details.reason: "max_output_tokens"`, Messages `stop_reason: "max_tokens"`; the arguments are the
engine's partial text, never a call reported as finished (which clients then fail to parse)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pydantic
import pytest
import yaml

from tests.both_engines import LOCAL, SERVER, both_engines, served
from tests.gateway_process import RunningGateway, gateway

pytestmark = pytest.mark.integration

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
LIMIT = 5


class GetWeather(pydantic.BaseModel):
    city: str


WEATHER_SCHEMA = GetWeather.model_json_schema()


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    root = tmp_path_factory.mktemp("truncated")
    env = {"ENGINEGATE_RESPONSE_STORE__PATH": str(root / "responses.sqlite3")}
    with gateway(config_yaml=yaml.safe_dump({"models": both_engines(root, 1024)}), env=env) as running:
        yield running


@pytest.fixture(params=[LOCAL, SERVER])
def model(request: pytest.FixtureRequest, gw: RunningGateway) -> str:
    return served(str(request.param))


def oai(gw: RunningGateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=300)


def claude(gw: RunningGateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key="unused", max_retries=0, timeout=300)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "GetWeather"}}])
def test_chat_parse_raises_length(gw: RunningGateway, model: str, choice: Any) -> None:
    with pytest.raises(openai.LengthFinishReasonError) as caught:
        oai(gw).chat.completions.parse(model=model, messages=ASK, max_tokens=LIMIT, temperature=0,  # type: ignore[arg-type]
                                       tools=[openai.pydantic_function_tool(GetWeather)], tool_choice=choice)
    completion = caught.value.completion
    choice0 = completion.choices[0]
    assert choice0.finish_reason == "length"
    call = (choice0.message.tool_calls or [])[0]
    assert call.function.name == "GetWeather" and call.function.arguments.startswith("{")
    assert completion.usage is not None and completion.usage.completion_tokens == LIMIT


def test_chat_stream_raises_length(gw: RunningGateway, model: str) -> None:
    with pytest.raises(openai.LengthFinishReasonError):
        with oai(gw).chat.completions.stream(model=model, messages=ASK, max_tokens=LIMIT, temperature=0,  # type: ignore[arg-type]
                                             tools=[openai.pydantic_function_tool(GetWeather)],
                                             tool_choice="required") as stream:
            for _ in stream:
                pass


def test_a_whole_call_still_says_tool_calls(gw: RunningGateway, model: str) -> None:
    """The fix must not turn every forced call into `length`: given room, the call finishes."""
    out = oai(gw).chat.completions.parse(model=model, messages=ASK, max_tokens=200, temperature=0,  # type: ignore[arg-type]
                                         tools=[openai.pydantic_function_tool(GetWeather)], tool_choice="required")
    assert out.choices[0].finish_reason == "tool_calls"
    call = (out.choices[0].message.tool_calls or [])[0]
    assert isinstance(call.function.parsed_arguments, GetWeather)


RESPONSES_TOOL = [{"type": "function", "name": "get_weather", "parameters": WEATHER_SCHEMA}]


def test_responses_incomplete(gw: RunningGateway, model: str) -> None:
    out = oai(gw).responses.create(model=model, input="What is the weather in Paris?", max_output_tokens=LIMIT,
                                   temperature=0, tools=RESPONSES_TOOL, tool_choice="required")  # type: ignore[arg-type]
    assert out.status == "incomplete"
    assert out.incomplete_details is not None and out.incomplete_details.reason == "max_output_tokens"
    call = out.output[-1]
    assert call.type == "function_call" and call.status == "incomplete" and call.arguments.startswith("{")


def test_responses_stream_incomplete(gw: RunningGateway, model: str) -> None:
    with oai(gw).responses.stream(model=model, input="What is the weather in Paris?", max_output_tokens=LIMIT,
                                  temperature=0, tools=RESPONSES_TOOL, tool_choice="required") as stream:  # type: ignore[arg-type]
        events = list(stream)  # the SDK's get_final_response() waits for response.completed only
    assert events[-1].type == "response.incomplete"
    final = events[-1].response  # type: ignore[union-attr]
    assert final.status == "incomplete" and final.incomplete_details is not None
    assert final.incomplete_details.reason == "max_output_tokens"


MESSAGES_TOOL = [{"name": "get_weather", "input_schema": WEATHER_SCHEMA}]


def test_messages_max_tokens(gw: RunningGateway, model: str) -> None:
    out = claude(gw).messages.create(model=model, max_tokens=LIMIT, messages=ASK,  # type: ignore[arg-type]
                                     tools=MESSAGES_TOOL, tool_choice={"type": "any"})  # type: ignore[arg-type]
    assert out.stop_reason == "max_tokens"
    assert out.content[-1].type == "tool_use"


def test_messages_stream_max_tokens(gw: RunningGateway, model: str) -> None:
    with claude(gw).messages.stream(model=model, max_tokens=LIMIT, messages=ASK,  # type: ignore[arg-type]
                                    tools=MESSAGES_TOOL, tool_choice={"type": "any"}) as stream:  # type: ignore[arg-type]
        for _ in stream:
            pass
        final = stream.get_final_message()
    assert final.stop_reason == "max_tokens"
