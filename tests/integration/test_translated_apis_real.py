"""Responses and Anthropic Messages on the real gateway serving the embedded model (llama.cpp in-process),
driven by the official `openai` and `anthropic` clients; the stored conversation survives a restart.

SmolLM2-135M rarely calls a tool by itself, so the tool round trips force the call with tool_choice
naming the function (llama-cpp-python then constrains the output to the function's JSON schema).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest

from tests.gateway_process import RunningGateway, gateway

pytestmark = pytest.mark.integration

MODEL = "smollm2-135m-instruct"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
MESSAGES_ORDER_HEAD = ["message_start", "ping"]


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("store") / "responses.sqlite3"


@pytest.fixture(scope="module")
def gw(store_path: Path) -> Iterator[RunningGateway]:
    with gateway(env={"ENGINEGATE_RESPONSE_STORE__PATH": str(store_path)}) as running:
        yield running


@pytest.fixture(scope="module")
def oai(gw: RunningGateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def claude(gw: RunningGateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key="unused", max_retries=0, timeout=120)


def raw_events(gw: RunningGateway, path: str, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    with httpx.stream("POST", gw.url + path, json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        text = r.read().decode()
    events = []
    for block in text.split("\n\n"):
        if block:
            lines = dict(line.split(": ", 1) for line in block.split("\n"))
            data = json.loads(lines["data"])
            assert data["type"] == lines["event"]
            events.append((lines["event"], data))
    return events


def check_messages_order(names: list[str]) -> None:
    """Anthropic's published order: message_start, (ping), blocks each start-delta*-stop, message_delta, message_stop."""
    assert names[:2] == MESSAGES_ORDER_HEAD and names[-2:] == ["message_delta", "message_stop"]
    body = names[2:-2]
    open_block = False
    for name in body:
        if name == "content_block_start":
            assert not open_block
            open_block = True
        elif name == "content_block_delta":
            assert open_block
        elif name == "content_block_stop":
            assert open_block
            open_block = False
        else:
            assert name == "ping", name
    assert not open_block


def check_responses_order(events: list[tuple[str, dict[str, Any]]]) -> None:
    names = [n for n, _ in events]
    assert names[:2] == ["response.created", "response.in_progress"]
    assert names[-1] in {"response.completed", "response.incomplete"}
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    item: str | None = None
    for name, data in events[2:-1]:
        if name == "response.output_item.added":
            assert item is None
            item = data["item"]["type"]
        elif name == "response.output_item.done":
            assert item == data["item"]["type"]
            item = None
        elif item == "message":
            assert name.startswith(("response.content_part.", "response.output_text."))
        else:
            assert item == "function_call" and name.startswith("response.function_call_arguments.")
    assert item is None


# -- Anthropic Messages ---------------------------------------------------------------------------


def test_messages_create_and_stream_agree(claude: anthropic.Anthropic, gw: RunningGateway) -> None:
    ask = [{"role": "user", "content": "Say hello in five words."}]
    msg = claude.messages.create(model=MODEL, max_tokens=12, messages=ask, system="You are terse.",  # type: ignore[arg-type]
                                 extra_body={"temperature": 0})
    assert msg.type == "message" and msg.role == "assistant" and msg.content[0].type == "text"
    assert msg.content[0].text and msg.stop_reason in {"end_turn", "max_tokens"}
    assert msg.usage.input_tokens > 5 and 0 < msg.usage.output_tokens <= 12
    with claude.messages.stream(model=MODEL, max_tokens=12, messages=ask, system="You are terse.",  # type: ignore[arg-type]
                                extra_body={"temperature": 0}) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    # (not compared with the whole answer: llama.cpp's reuse of the cached prompt can change a greedy token)
    assert streamed and final.content[0].text == streamed  # type: ignore[union-attr]
    assert final.usage.input_tokens == msg.usage.input_tokens and 0 < final.usage.output_tokens <= 12
    events = raw_events(gw, "/v1/messages", {"model": MODEL, "max_tokens": 8, "stream": True, "messages": ask})
    check_messages_order([n for n, _ in events])


def test_messages_tool_use_round_trip(claude: anthropic.Anthropic, gw: RunningGateway) -> None:
    tools = [{"name": "weather", "description": "Current weather for a city", "input_schema": WEATHER}]
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    msg = claude.messages.create(model=MODEL, max_tokens=40, messages=ask, tools=tools,  # type: ignore[arg-type]
                                 tool_choice={"type": "tool", "name": "weather"})
    assert msg.stop_reason == "tool_use"
    use = [b for b in msg.content if b.type == "tool_use"]
    assert len(use) == 1 and use[0].name == "weather" and isinstance(use[0].input["city"], str)  # type: ignore[index]
    answer = claude.messages.create(model=MODEL, max_tokens=20, tools=tools, messages=[  # type: ignore[arg-type]
        *ask,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use[0].id, "content": "Sunny, 21 C"}]},
    ])
    assert answer.content and answer.usage.input_tokens > msg.usage.input_tokens
    events = raw_events(gw, "/v1/messages", {"model": MODEL, "max_tokens": 40, "stream": True, "messages": ask,
                                             "tools": tools, "tool_choice": {"type": "tool", "name": "weather"}})
    names = [n for n, _ in events]
    check_messages_order(names)
    starts = [d["content_block"] for n, d in events if n == "content_block_start"]
    assert [b["type"] for b in starts] == ["tool_use"] and starts[0]["name"] == "weather"
    partial = "".join(d["delta"]["partial_json"] for n, d in events if n == "content_block_delta")
    assert isinstance(json.loads(partial)["city"], str)
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_messages_count_tokens_matches_usage(claude: anthropic.Anthropic) -> None:
    ask = [{"role": "user", "content": "Count me, please."}]
    counted = claude.messages.count_tokens(model=MODEL, messages=ask, system="Be brief.")  # type: ignore[arg-type]
    msg = claude.messages.create(model=MODEL, max_tokens=2, messages=ask, system="Be brief.")  # type: ignore[arg-type]
    assert counted.input_tokens == msg.usage.input_tokens > 5


def test_messages_bad_input(claude: anthropic.Anthropic, gw: RunningGateway) -> None:
    r = httpx.post(gw.url + "/v1/messages", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}, timeout=30)
    assert r.status_code == 400 and r.json()["type"] == "error" and "max_tokens" in r.json()["error"]["message"]
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model=MODEL, max_tokens=5, messages=[
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_none", "content": "x"}]}])
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": [{"type": "text"}]}])  # type: ignore[list-item, typeddict-item]
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="no-such-model", max_tokens=5, messages=[{"role": "user", "content": "hi"}])


# -- OpenAI Responses -----------------------------------------------------------------------------


def test_responses_plain_stream_and_stored(oai: openai.OpenAI, gw: RunningGateway) -> None:
    r = oai.responses.create(model=MODEL, input="Say hello in five words.", max_output_tokens=12, temperature=0)
    assert r.status in {"completed", "incomplete"} and r.output_text
    assert r.usage is not None and r.usage.input_tokens > 5 and 0 < r.usage.output_tokens <= 12
    stream = oai.responses.create(model=MODEL, input="Say hello in five words.", max_output_tokens=12, temperature=0,
                                  stream=True)
    events = list(stream)
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    assert streamed and events[-1].response.output_text == streamed  # type: ignore[union-attr]
    assert events[-1].response.usage.input_tokens == r.usage.input_tokens  # type: ignore[union-attr]
    check_responses_order(raw_events(gw, "/v1/responses", {"model": MODEL, "input": "Hi", "max_output_tokens": 6,
                                                          "stream": True}))
    assert oai.responses.retrieve(r.id).output_text == r.output_text
    oai.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(r.id)


def test_responses_json_schema_is_enforced(oai: openai.OpenAI) -> None:
    r = oai.responses.create(model=MODEL, input="The weather in Oslo, as JSON.", max_output_tokens=40, temperature=0,
                             text={"format": {"type": "json_schema", "name": "weather", "schema": WEATHER}})
    jsonschema.validate(json.loads(r.output_text), WEATHER)


def test_responses_bad_input(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        oai.responses.create(model=MODEL, input="hi", previous_response_id="resp_does_not_exist")
    assert info.value.code == "previous_response_not_found"
    with pytest.raises(openai.BadRequestError):
        oai.responses.create(model=MODEL, input=[{"type": "function_call_output", "call_id": "nope", "output": "x"}])


def test_responses_tool_round_trip_survives_a_restart(oai: openai.OpenAI, store_path: Path) -> None:
    tools = [{"type": "function", "name": "weather", "description": "Current weather for a city", "parameters": WEATHER}]
    first = oai.responses.create(model=MODEL, input="What is the weather in Paris?", tools=tools,  # type: ignore[arg-type]
                                 tool_choice={"type": "function", "name": "weather"}, max_output_tokens=40)
    calls = [o for o in first.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "weather"
    assert isinstance(json.loads(calls[0].arguments)["city"], str)
    second = oai.responses.create(model=MODEL, previous_response_id=first.id, tools=tools,  # type: ignore[arg-type]
                                  input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                          "output": "Sunny, 21 C"}], max_output_tokens=20, temperature=0)
    assert second.previous_response_id == first.id and second.output
    assert second.usage is not None and first.usage is not None and second.usage.input_tokens > first.usage.input_tokens
    # a fresh gateway process on the same store continues the stored conversation
    with gateway(env={"ENGINEGATE_RESPONSE_STORE__PATH": str(store_path)}) as again:
        client = openai.OpenAI(base_url=again.base_url, api_key="unused", max_retries=0, timeout=120)
        assert client.responses.retrieve(second.id).output_text == second.output_text
        items = client.responses.input_items.list(second.id, order="asc")
        assert [i.type for i in items.data] == ["function_call_output"]
        # the same tools as before: their definitions are in the prompt (this template ignores tools, so the
        # gateway writes them there), and only the history should differ
        third = client.responses.create(model=MODEL, previous_response_id=second.id, input="Thanks! Anything else?",
                                        tools=tools, max_output_tokens=8, temperature=0)  # type: ignore[arg-type]
        assert third.usage is not None and second.usage is not None
        assert third.usage.input_tokens > second.usage.input_tokens  # the whole history went to the engine
