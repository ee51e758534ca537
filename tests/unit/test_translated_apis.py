"""Responses and Anthropic Messages through the real app and the official clients, over a scripted chat adapter.

The adapter answers with chat completions/chunks given by the test (text, tool calls), so the
translation both ways is checked exactly; tests/integration/test_translated_apis_real.py runs the real model.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import orjson
import pytest
from fastapi.testclient import TestClient

from adapters.base import Adapter, Capabilities, Completion, Health, RequestContext, StreamEvent, Usage
from gateway.app import create_app
from gateway.config import Settings
from gateway.runtime import runtime_for_adapters
from tests.fakes import EchoAdapter
from tests.unit.test_api_stream import metric_value

USAGE = Usage(prompt_tokens=7, completion_tokens=5)
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


class ScriptAdapter(Adapter):
    """Answers every chat request with `text` and then `calls` ((id, name, arguments) each)."""

    engine = "script"
    capabilities = Capabilities(chat=True, completions=False, tools=True, structured_output=True)

    def __init__(self) -> None:
        self.text = "Hello there"
        self.calls: list[tuple[str, str, str]] = []
        self.finish = "stop"
        self.bodies: list[dict[str, Any]] = []

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def health(self) -> Health:
        return Health(ready=True)

    async def chat(self, body: dict[str, Any], ctx: RequestContext) -> Completion | AsyncIterator[StreamEvent]:
        self.bodies.append(body)
        finish = "tool_calls" if self.calls else self.finish
        if body.get("stream"):
            return self._stream(finish)
        calls = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in self.calls]
        message = {"role": "assistant", "content": self.text or None, **({"tool_calls": calls} if calls else {})}
        return Completion({"id": "c", "object": "chat.completion", "choices": [{"index": 0, "message": message,
                                                                                 "finish_reason": finish}],
                           "usage": USAGE.as_dict()}, usage=USAGE)

    async def _stream(self, finish: str) -> AsyncIterator[StreamEvent]:
        def chunk(delta: dict[str, Any], reason: str | None = None) -> bytes:
            return orjson.dumps({"id": "c", "object": "chat.completion.chunk",
                                 "choices": [{"index": 0, "delta": delta, "finish_reason": reason}]})

        yield StreamEvent(chunk({"role": "assistant"}))
        for word in self.text.split(" ") if self.text else []:
            yield StreamEvent(chunk({"content": word + " "}), has_content=True)
        for n, (call_id, name, args) in enumerate(self.calls):
            yield StreamEvent(chunk({"tool_calls": [{"index": n, "id": call_id, "type": "function",
                                                     "function": {"name": name, "arguments": ""}}]}), has_content=True)
            half = len(args) // 2
            for piece in (args[:half], args[half:]):
                yield StreamEvent(chunk({"tool_calls": [{"index": n, "function": {"arguments": piece}}]}), has_content=True)
        yield StreamEvent(chunk({}, finish), finish_reason=finish)
        yield StreamEvent(orjson.dumps({"choices": [], "usage": USAGE.as_dict()}), usage=USAGE)


@pytest.fixture
def script() -> ScriptAdapter:
    return ScriptAdapter()


@pytest.fixture
def app_client(script: ScriptAdapter, tmp_path: Path) -> Iterator[TestClient]:
    s = Settings(response_store={"path": tmp_path / "responses.sqlite3"}, api_keys=("k1",))
    with TestClient(create_app(s, runtime_for_adapters(s, {"m": script, "echo": EchoAdapter(fail_after=1)}))) as c:
        yield c


@pytest.fixture
def claude(app_client: TestClient) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url="http://testserver", api_key="k1", http_client=app_client, max_retries=0)


@pytest.fixture
def oai(app_client: TestClient) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://testserver/v1", api_key="k1", http_client=app_client, max_retries=0)


def sse(text: str) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for block in text.split("\n\n"):
        if block:
            lines = dict(line.split(": ", 1) for line in block.split("\n"))
            events.append((lines["event"], orjson.loads(lines["data"])))
    return events


# -- Anthropic Messages ---------------------------------------------------------------------------


def test_messages_request_becomes_chat_with_tools_and_history(claude: anthropic.Anthropic, script: ScriptAdapter) -> None:
    msg = claude.messages.create(
        model="m", max_tokens=50, system="Be brief.", stop_sequences=["END"], extra_body={"temperature": 0.5},
        tools=[{"name": "weather", "description": "Weather now", "input_schema": WEATHER}],
        tool_choice={"type": "tool", "name": "weather"},
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"},
                                         {"type": "text", "text": "And so?"}]},
        ],
    )
    body = script.bodies[-1]
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"},
        {"role": "user", "content": "And so?"},
    ]
    assert body["tools"] == [{"type": "function", "function": {"name": "weather", "description": "Weather now", "parameters": WEATHER}}]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    assert (body["max_tokens"], body["stop"], body["temperature"]) == (50, ["END"], 0.5)
    assert msg.type == "message" and msg.role == "assistant" and msg.model == "m"
    assert msg.content[0].type == "text" and msg.content[0].text == "Hello there"
    assert msg.stop_reason == "end_turn"
    assert (msg.usage.input_tokens, msg.usage.output_tokens) == (7, 5)


def test_messages_tool_use_answer(claude: anthropic.Anthropic, script: ScriptAdapter) -> None:
    script.text, script.calls = "", [("call_9", "weather", '{"city": "Oslo"}')]
    msg = claude.messages.create(model="m", max_tokens=20, messages=[{"role": "user", "content": "Oslo?"}],
                                 tools=[{"name": "weather", "input_schema": WEATHER}])
    assert msg.stop_reason == "tool_use"
    assert [b.type for b in msg.content] == ["tool_use"]
    assert (msg.content[0].id, msg.content[0].name, msg.content[0].input) == ("call_9", "weather", {"city": "Oslo"})


def test_messages_stream_event_order_text_then_tool(app_client: TestClient, claude: anthropic.Anthropic,
                                                    script: ScriptAdapter) -> None:
    script.calls = [("call_1", "weather", '{"city": "Rome"}')]
    body = {"model": "m", "max_tokens": 20, "stream": True, "messages": [{"role": "user", "content": "Rome?"}],
            "tools": [{"name": "weather", "input_schema": WEATHER}]}
    r = app_client.post("/v1/messages", json=body, headers={"x-api-key": "k1"})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse(r.text)
    assert all(name == data["type"] for name, data in events)
    assert [n for n, _ in events] == [
        "message_start", "ping",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop",
    ]
    assert events[2][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert events[6][1]["content_block"] == {"type": "tool_use", "id": "call_1", "name": "weather", "input": {}}
    assert {events[7][1]["delta"]["type"], events[7][1]["index"]} == {"input_json_delta", 1}
    assert events[10][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[10][1]["usage"]["output_tokens"] == 5

    with claude.messages.stream(model="m", max_tokens=20, messages=[{"role": "user", "content": "Rome?"}],
                                tools=[{"name": "weather", "input_schema": WEATHER}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Hello there "
    assert final.content[1].input == {"city": "Rome"}
    assert final.stop_reason == "tool_use" and final.usage.input_tokens == 7 and final.usage.output_tokens == 5


def test_messages_count_tokens(claude: anthropic.Anthropic, script: ScriptAdapter) -> None:
    count = claude.messages.count_tokens(model="m", system="Be brief.", messages=[{"role": "user", "content": "Hi"}])
    assert count.input_tokens == 7
    assert script.bodies[-1]["max_tokens"] == 1 and not script.bodies[-1].get("stream")


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "text"}]}]}, "text"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "video", "x": 1}]}]}, "video"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_nope", "content": "x"}]}]}, "toolu_nope"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
          "tool_choice": {"type": "tool", "name": "ghost"}}, "ghost"),
    ],
)
def test_messages_bad_input_is_400_in_anthropic_shape(app_client: TestClient, body: dict[str, Any], needle: str) -> None:
    r = app_client.post("/v1/messages", json=body, headers={"x-api-key": "k1"})
    assert r.status_code == 400, r.text
    data = r.json()
    assert data["type"] == "error" and data["error"]["type"] == "invalid_request_error"
    assert needle in data["error"]["message"]
    assert set(data) == {"type", "error"}


def test_messages_official_client_raises_bad_request(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(model="m", max_tokens=5, messages=[
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "y"}]}])
    assert info.value.status_code == 400
    assert info.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]


def test_messages_keys_unknown_model_and_engine_failure(app_client: TestClient) -> None:
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    r = app_client.post("/v1/messages", json=body, headers={"x-api-key": "wrong"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert app_client.post("/v1/messages", json=body).status_code == 401
    assert app_client.post("/v1/messages", json=body, headers={"authorization": "Bearer k1"}).status_code == 200
    r = app_client.post("/v1/messages", json={**body, "model": "nope"}, headers={"x-api-key": "k1"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    # x-api-key is the Anthropic route's header only; chat keeps Authorization
    r = app_client.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                        headers={"x-api-key": "k1"})
    assert r.status_code == 401 and "error" in r.json() and "type" not in r.json()
    # the engine dies after one word: the stream ends with Anthropic's error event, never hangs
    r = app_client.post("/v1/messages", json={**body, "model": "echo", "stream": True,
                                              "messages": [{"role": "user", "content": "one two three"}]},
                        headers={"x-api-key": "k1"})
    events = sse(r.text)
    assert [n for n, _ in events][:2] == ["message_start", "ping"]
    assert events[-1][0] == "error" and events[-1][1]["error"]["type"] == "api_error"
    assert "engine died" in events[-1][1]["error"]["message"]


# -- OpenAI Responses -----------------------------------------------------------------------------


def test_responses_plain_and_stored(oai: openai.OpenAI, script: ScriptAdapter) -> None:
    r = oai.responses.create(model="m", input="Hi", instructions="Be brief.", max_output_tokens=9, temperature=0.2)
    assert r.object == "response" and r.status == "completed" and r.output_text == "Hello there"
    assert r.usage is not None and (r.usage.input_tokens, r.usage.output_tokens, r.usage.total_tokens) == (7, 5, 12)
    assert script.bodies[-1]["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert (script.bodies[-1]["max_tokens"], script.bodies[-1]["temperature"]) == (9, 0.2)
    got = oai.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == "Hello there"
    items = oai.responses.input_items.list(r.id)
    assert [i.type for i in items.data] == ["message"] and items.data[0].role == "user"  # type: ignore[union-attr]
    oai.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(r.id)


def test_responses_not_stored_when_store_false(oai: openai.OpenAI) -> None:
    r = oai.responses.create(model="m", input="Hi", store=False)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(r.id)
    with pytest.raises(openai.BadRequestError) as info:
        oai.responses.create(model="m", input="again", previous_response_id=r.id)
    assert info.value.code == "previous_response_not_found"


def test_responses_function_call_round_trip_with_previous_response_id(oai: openai.OpenAI, script: ScriptAdapter) -> None:
    script.text, script.calls = "", [("call_7", "weather", '{"city":"Oslo"}')]
    tools = [{"type": "function", "name": "weather", "description": "Weather now", "parameters": WEATHER}]
    first = oai.responses.create(model="m", input="Weather in Oslo?", tools=tools,  # type: ignore[arg-type]
                                 tool_choice={"type": "function", "name": "weather"})
    assert script.bodies[-1]["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    assert script.bodies[-1]["tools"][0]["function"]["parameters"] == WEATHER
    calls = [o for o in first.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].call_id == "call_7" and calls[0].arguments == '{"city":"Oslo"}'
    script.text, script.calls = "It is 18C.", []
    second = oai.responses.create(model="m", previous_response_id=first.id, tools=tools,  # type: ignore[arg-type]
                                  input=[{"type": "function_call_output", "call_id": "call_7", "output": "18C"}])
    assert second.output_text == "It is 18C." and second.previous_response_id == first.id
    assert script.bodies[-1]["messages"] == [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_7", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_7", "content": "18C"},
    ]
    with pytest.raises(openai.BadRequestError) as info:
        oai.responses.create(model="m", previous_response_id=first.id,
                             input=[{"type": "function_call_output", "call_id": "call_unknown", "output": "x"}])
    assert info.value.status_code == 400 and "call_unknown" in info.value.message


EXPECTED_RESPONSES_STREAM = [
    "response.created", "response.in_progress",
    "response.output_item.added", "response.content_part.added",
    "response.output_text.delta", "response.output_text.delta",
    "response.output_text.done", "response.content_part.done", "response.output_item.done",
    "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.delta",
    "response.function_call_arguments.done", "response.output_item.done",
    "response.completed",
]


def test_responses_stream_event_order_and_sequence_numbers(oai: openai.OpenAI, script: ScriptAdapter) -> None:
    script.calls = [("call_3", "weather", '{"city":"Rome"}')]
    tools = [{"type": "function", "name": "weather", "parameters": WEATHER}]
    events = list(oai.responses.create(model="m", input="Rome?", tools=tools, stream=True))  # type: ignore[arg-type]
    assert [e.type for e in events] == EXPECTED_RESPONSES_STREAM
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = events[-1].response  # type: ignore[union-attr]
    assert [o.type for o in done.output] == ["message", "function_call"]
    assert done.output[1].arguments == '{"city":"Rome"}' and done.output[1].call_id == "call_3"
    assert events[2].item.id == events[4].item_id == done.output[0].id  # type: ignore[union-attr]
    assert events[9].item.id == events[10].item_id == done.output[1].id  # type: ignore[union-attr]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Hello there "  # type: ignore[union-attr]
    assert oai.responses.retrieve(done.id).output[1].arguments == '{"city":"Rome"}'  # type: ignore[union-attr]


def test_responses_length_is_incomplete(oai: openai.OpenAI, script: ScriptAdapter) -> None:
    script.finish = "length"
    r = oai.responses.create(model="m", input="Hi", max_output_tokens=2)
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"
    events = list(oai.responses.create(model="m", input="Hi", max_output_tokens=2, stream=True))
    assert events[-1].type == "response.incomplete"


def test_responses_json_schema_becomes_response_format(oai: openai.OpenAI, script: ScriptAdapter) -> None:
    oai.responses.create(model="m", input="Hi", text={"format": {"type": "json_schema", "name": "w", "schema": WEATHER}})
    assert script.bodies[-1]["response_format"] == {"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER,
                                                                                           "strict": False}}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "hi", "previous_response_id": "resp_missing"}, "previous_response_id"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"input": []}, "input"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
        ({"input": "hi", "tool_choice": {"type": "function", "name": "ghost"}}, "tool_choice"),
        ({}, "input"),
    ],
)
def test_responses_bad_input_is_400_in_openai_shape(app_client: TestClient, body: dict[str, Any], param: str) -> None:
    r = app_client.post("/v1/responses", json={"model": "m", **body}, headers={"authorization": "Bearer k1"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param


def test_responses_engine_failure_mid_stream_ends_failed(app_client: TestClient) -> None:
    r = app_client.post("/v1/responses", json={"model": "echo", "input": "one two three", "stream": True},
                        headers={"authorization": "Bearer k1"})
    events = sse(r.text)
    assert [n for n, _ in events][:2] == ["response.created", "response.in_progress"]
    assert [n for n, _ in events][-2:] == ["error", "response.failed"]
    assert events[-1][1]["response"]["status"] == "failed"
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))


def test_translated_routes_are_counted_like_chat(app_client: TestClient) -> None:
    h = {"authorization": "Bearer k1"}
    app_client.post("/v1/messages", json={"model": "m", "max_tokens": 5, "stream": True,
                                          "messages": [{"role": "user", "content": "hi"}]}, headers=h)
    app_client.post("/v1/responses", json={"model": "m", "input": "hi", "stream": True}, headers=h)
    app_client.post("/v1/responses", json={"model": "m", "input": "hi"}, headers=h)
    app_client.post("/v1/responses", json={"model": "m", "input": "hi", "previous_response_id": "resp_x"}, headers=h)
    text = app_client.get("/metrics").text
    assert metric_value(text, "enginegate_requests_total", route="/v1/messages", model="m", status="200") == 1
    assert metric_value(text, "enginegate_requests_total", route="/v1/responses", model="m", status="200") == 2
    assert metric_value(text, "enginegate_requests_total", route="/v1/responses", model="unknown", status="400") == 1
    assert metric_value(text, "enginegate_time_to_first_token_seconds_count", model="m", engine="script") == 2
    assert metric_value(text, "enginegate_completion_tokens_total", model="m", engine="script") == 15
    assert metric_value(text, "enginegate_prompt_tokens_total", model="m", engine="script") == 21


# -- the store ------------------------------------------------------------------------------------


async def test_sqlite_store_retention_concurrency_and_reopen(tmp_path: Path) -> None:
    import time

    from gateway.api.response_store import StoredResponse
    from gateway.api.sqlite_response_store import SQLiteResponseStore

    path = tmp_path / "deep" / "r.sqlite3"
    store = SQLiteResponseStore(path, max_age_s=3600, max_count=30)

    def record(i: int, age: float = 0.0) -> StoredResponse:
        return StoredResponse(f"resp_{i}", "", time.time() - age, {"id": f"resp_{i}"}, [{"id": f"in_{i}"}], [{"n": i}])

    await asyncio.gather(*(store.put(record(i)) for i in range(40)))  # concurrent writers, one file
    kept = [r for r in await asyncio.gather(*(store.get(f"resp_{i}", None) for i in range(40))) if r is not None]
    assert len(kept) == 30
    reopened = SQLiteResponseStore(path, max_age_s=3600, max_count=30)  # a restarted gateway
    got = await reopened.get(kept[0].id, None)
    assert got is not None and got.history == kept[0].history and got.input_items == kept[0].input_items
    await reopened.put(record(100, age=7200))  # older than max_age: pruned on write, never served
    assert await reopened.get("resp_100", None) is None
    assert await reopened.delete(kept[0].id, None) and not await reopened.delete(kept[0].id, None)


def test_messages_output_config_format_becomes_response_format(claude: anthropic.Anthropic, script: ScriptAdapter) -> None:
    claude.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}],
                           output_config={"format": {"type": "json_schema", "schema": WEATHER}})
    assert script.bodies[-1]["response_format"] == {"type": "json_schema", "json_schema": {"name": "output", "schema": WEATHER}}


async def test_a_client_leaving_a_translated_stream_cancels_the_generation_and_stores_nothing() -> None:
    from adapters.base import RequestContext
    from gateway.api.messages_translate import MessagesWriter
    from gateway.api.responses_translate import ResponseShell, ResponsesRequest, ResponsesWriter
    from gateway.api.resume import Held
    from gateway.api.serving import _sse
    from gateway.metrics import GatewayMetrics
    from gateway.routing import Admission, Backend

    stored: list[dict[str, Any]] = []

    async def on_done(response: dict[str, Any]) -> None:
        stored.append(response)

    shell = ResponseShell(ResponsesRequest(model="echo", input="x"))
    for writer in (ResponsesWriter(shell, on_done), MessagesWriter("echo")):
        adapter = EchoAdapter()
        backend = Backend(model_id="echo", adapter=adapter, admission=Admission(1, 0))
        lease = await backend.acquire()
        m = GatewayMetrics()
        body = {"model": "echo", "stream": True, "messages": [{"role": "user", "content": "a b c d e f"}]}
        events = await adapter.chat(body, RequestContext("r", "echo", include_usage=True))
        sse_stream = _sse(events, backend, Held(lease), m, 0.0, writer)  # type: ignore[arg-type]
        first = await sse_stream.__anext__()
        assert first.startswith(b"event: ")
        await sse_stream.__anext__()
        await sse_stream.aclose()  # what Starlette does when the client goes away
        assert adapter.closed_streams == 1 and adapter.completed_streams == 0
        assert backend.admission.running == 0
        assert metric_value(m.render().decode(), "enginegate_client_disconnects_total", model="echo", engine="echo") == 1
    assert stored == []


def test_responses_stream_helper_accumulates_the_events(oai: openai.OpenAI, script: ScriptAdapter) -> None:
    """The SDK's own accumulator (responses.stream) rebuilds the Response from the events alone."""
    script.calls = [("call_5", "weather", '{"city":"Kyiv"}')]
    tools = [{"type": "function", "name": "weather", "parameters": WEATHER}]
    with oai.responses.stream(model="m", input="Kyiv?", tools=tools) as stream:  # type: ignore[arg-type]
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert text == "Hello there " and final.output_text == "Hello there "
    assert final.output[1].type == "function_call" and final.output[1].arguments == '{"city":"Kyiv"}'


def test_n_choices_fan_out_merges_whole_and_streamed(app_client: TestClient) -> None:
    h = {"authorization": "Bearer k1"}
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 3, "seed": 1}
    r = app_client.post("/v1/chat/completions", json=body, headers=h).json()
    assert [c["index"] for c in r["choices"]] == [0, 1, 2]
    assert r["usage"] == {"prompt_tokens": 7, "completion_tokens": 15, "total_tokens": 22}
    r = app_client.post("/v1/chat/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}},
                        headers=h)
    chunks = [orjson.loads(b[6:]) for b in r.text.split("\n\n") if b and b != "data: [DONE]"]
    assert sorted({c["choices"][0]["index"] for c in chunks if c["choices"]}) == [0, 1, 2]
    assert [c["choices"][0]["index"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]] == [0, 1, 2]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 15
    assert r.text.endswith("data: [DONE]\n\n") and r.text.count("usage") == 1
    text = app_client.get("/metrics").text
    assert metric_value(text, "enginegate_time_to_first_token_seconds_count", model="m", engine="script") == 1
    assert metric_value(text, "enginegate_completion_tokens_total", model="m", engine="script") == 30
