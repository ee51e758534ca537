"""A forced tool_choice made by a JSON schema (llama-server): the request it becomes, and the answer
turned into the function's call, whole and streamed, in the spec's shape."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from adapters import forced_tools
from adapters.base import Completion, StreamEvent, Usage
from tests.conformance.openai_spec import check
from tests.unit.test_chat_shape import accumulate

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": n, "parameters": PARAMS}} for n in ("get_weather", "get_time")]


@pytest.mark.parametrize(("choice", "tools", "name", "pick"), [
    ({"type": "function", "function": {"name": "get_time"}}, TOOLS, "get_time", False),
    ("required", TOOLS[:1], "get_weather", False),
    ("required", TOOLS, None, True),
    ({"type": "function", "function": {"name": "nope"}}, TOOLS, None, False),
])
def test_which_function(choice: Any, tools: list[dict[str, Any]], name: str | None, pick: bool) -> None:
    body = {"tools": tools, "tool_choice": choice}
    fn = forced_tools.forced_function(body)
    assert (fn or {}).get("name") == name and forced_tools.needs_pick(body) is pick


def test_requests() -> None:
    body = {"model": "m", "messages": [], "tools": TOOLS, "tool_choice": "required", "stream": True, "n": 2}
    pick = forced_tools.pick_request(body)
    assert pick["grammar"] == 'root ::= "get_weather" | "get_time"' and pick["max_tokens"] == len("get_weather") + 4
    assert not {"tools", "tool_choice", "stream", "n"} & pick.keys()
    schema = forced_tools.schema_request(body, TOOLS[1]["function"])
    assert "tools" not in schema and schema["response_format"]["json_schema"] == {"name": "get_time", "schema": PARAMS,
                                                                                  "strict": True}


def test_whole_answer_becomes_the_call() -> None:
    body = {"id": "c", "object": "chat.completion", "created": 1, "model": "m", "usage": Usage(3, 4).as_dict(),
            "choices": [{"index": 0, "logprobs": None, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": '{"city": "Paris"}', "refusal": None}}]}
    result = forced_tools.as_tool_call(Completion(orjson.dumps(body), Usage(3, 4)), "get_weather")
    assert isinstance(result.body, dict)
    check("CreateChatCompletionResponse", result.body)
    choice = result.body["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'} and call["id"].startswith("call_")


async def test_streamed_answer_becomes_one_call() -> None:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> StreamEvent:
        data = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        return StreamEvent(orjson.dumps(data), bool(delta.get("content")), None, finish)

    async def upstream() -> AsyncIterator[StreamEvent]:
        for event in [chunk({"role": "assistant", "content": None}), chunk({"content": '{"city": '}),
                      chunk({"content": '"Paris"}'}), chunk({}, "stop"),
                      StreamEvent(b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
                                  b'"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}', usage=Usage(3, 4))]:
            yield event

    events = [e async for e in forced_tools.as_tool_call_stream(upstream(), "get_time")]
    chunks = [orjson.loads(e.data) for e in events]
    for c in chunks:
        check("CreateChatCompletionStreamResponse", c)
    calls = accumulate([c for c in chunks if c["choices"]])
    assert calls[0]["name"] == "get_time" and calls[0]["arguments"] == '{"city": "Paris"}' and len(calls) == 1
    assert [e.finish_reason for e in events if e.finish_reason] == ["tool_calls"] and events[-1].usage == Usage(3, 4)
