"""What the gateway does not do is refused, as the API refuses it: the official `openai` and `anthropic`
clients against a real `enginegate serve` (the embedded model on in-process llama.cpp, and on llama-server
for the checks an engine sees), each case a 400 with the API's `param` and `code` (Anthropic's errors carry
neither: its message names the field). The table is docs/reference/refusals.md's, plus the tool checks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
import yaml

from tests.both_engines import LOCAL, SERVER, both_engines, served
from tests.gateway_process import RunningGateway, gateway

pytestmark = pytest.mark.integration

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}
CUSTOM = {"type": "custom", "custom": {"name": "grep", "description": "free-form input"}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    root = tmp_path_factory.mktemp("refusals")
    env = {"ENGINEGATE_RESPONSE_STORE__PATH": str(root / "responses.sqlite3")}
    with gateway(config_yaml=yaml.safe_dump({"models": both_engines(root, 1024)}), env=env) as running:
        yield running


@pytest.fixture(params=[LOCAL, SERVER])
def model(request: pytest.FixtureRequest, gw: RunningGateway) -> str:
    return served(str(request.param))


def client(gw: RunningGateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=300)


CHAT = [
    ({"tool_choice": "required"}, "tool_choice", "invalid_value"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name", "invalid_value"),
    ({"tools": [CUSTOM]}, "tools[0].type", "invalid_value"),
    ({"tools": [CUSTOM], "tool_choice": "required"}, "tools[0].type", "invalid_value"),
    ({"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}}, "modalities", "unsupported_parameter"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio", "unsupported_parameter"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "notatype"}}}},
     "response_format.json_schema.schema", "invalid_json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": "an object"}}},
     "response_format.json_schema.schema", "invalid_json_schema"),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("extra", "param", "code"), CHAT)
def test_chat_refusals(gw: RunningGateway, model: str, stream: bool, extra: dict[str, Any], param: str, code: str) -> None:
    """Streamed or not, the refusal is the 400 itself (never a 200 and then an error event, never a 500)."""
    with pytest.raises(openai.BadRequestError) as caught:
        body: Any = client(gw).chat.completions.create(model=model, messages=ASK, max_tokens=3, stream=stream,
                                                        extra_body=extra)
        if stream:
            list(body)
    assert caught.value.status_code == 400
    assert (caught.value.param, caught.value.code) == (param, code), caught.value.body


COMPLETIONS = [
    ({"suffix": " the end."}, "suffix", "unsupported_parameter"),
    ({"best_of": 3}, "best_of", "unsupported_parameter"),
    ({"best_of": 1, "n": 2}, "best_of", "invalid_value"),
]


@pytest.mark.parametrize(("extra", "param", "code"), COMPLETIONS)
def test_completion_refusals(gw: RunningGateway, model: str, extra: dict[str, Any], param: str, code: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client(gw).completions.create(model=model, prompt="Once upon a time", max_tokens=3, extra_body=extra)
    assert (caught.value.param, caught.value.code) == (param, code), caught.value.body


def test_best_of_equal_to_n_is_served(gw: RunningGateway) -> None:
    out = client(gw).completions.create(model=LOCAL, prompt="Once upon a time", max_tokens=2, best_of=1)
    assert len(out.choices) == 1


RESPONSES = [
    ({"background": True}, "background", "unsupported_parameter"),
    ({"conversation": "conv_123"}, "conversation", "unsupported_parameter"),
    ({"include": ["message.output_text.logprobs"]}, "include", "unsupported_parameter"),
    ({"tool_choice": "required"}, "tool_choice", "invalid_value"),
    ({"tools": [{"type": "custom", "name": "grep"}]}, "tools[0].type", "invalid_value"),
    ({"tools": [{"type": "function", "name": "get_weather", "parameters": WEATHER}],
      "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice", "invalid_value"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "notatype"}}}},
     "text.format.schema", "invalid_json_schema"),
]


@pytest.mark.parametrize(("extra", "param", "code"), RESPONSES)
def test_responses_refusals(gw: RunningGateway, model: str, extra: dict[str, Any], param: str, code: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client(gw).responses.create(model=model, input="What is the weather in Paris?", max_output_tokens=16,
                                    extra_body=extra)
    assert (caught.value.param, caught.value.code) == (param, code), caught.value.body


def test_background_false_is_served(gw: RunningGateway) -> None:
    out = client(gw).responses.create(model=LOCAL, input="hi", max_output_tokens=2, background=False)
    assert out.status in ("completed", "incomplete")


MESSAGES = [
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 1}]}, "server tools (web_search_20250305)"),
    ({"tools": [{"name": "get_weather", "input_schema": WEATHER}], "tool_choice": {"type": "tool", "name": "nope"}},
     "tool_choice"),
]


@pytest.mark.parametrize(("extra", "named"), MESSAGES)
def test_messages_refusals(gw: RunningGateway, model: str, extra: dict[str, Any], named: str) -> None:
    claude = anthropic.Anthropic(base_url=gw.url, api_key="unused", max_retries=0, timeout=300)
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(model=model, max_tokens=16, messages=ASK, extra_body=extra)  # type: ignore[arg-type]
    assert caught.value.status_code == 400
    message = caught.value.body["error"]["message"]  # type: ignore[index]
    assert named in message and "Field required" not in message, message


def test_thinking_disabled_is_served(gw: RunningGateway) -> None:
    claude = anthropic.Anthropic(base_url=gw.url, api_key="unused", max_retries=0, timeout=300)
    out = claude.messages.create(model=LOCAL, max_tokens=2, messages=ASK, thinking={"type": "disabled"})  # type: ignore[arg-type]
    assert out.stop_reason in ("max_tokens", "end_turn")


def test_a_custom_tool_stream_never_starts(gw: RunningGateway) -> None:
    """The raw stream (not a client's view of it): a 400 JSON error, no 200 and no SSE."""
    body = {"model": LOCAL, "messages": ASK, "tools": [CUSTOM], "tool_choice": "required", "stream": True}
    r = httpx.post(gw.base_url + "/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]["code"] == "invalid_value"
