"""Chat results mended into OpenAI's shape: the chunks llama-cpp-python's named-tool stream really sends,
and conformant chunks left untouched (so the relay re-serialises nothing that is already right)."""

from __future__ import annotations

import copy
import json
from typing import Any

from adapters.chat_shape import ToolCallDeltas, mend_completion
from tests.conformance.openai_spec import check

CALL_ID = "call__0_get_weather_cmpl-1"


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "finish_reason": finish, "logprobs": None, "delta": delta}]}


def _llama_cpp_named_stream(fragments: list[str]) -> list[dict[str, Any]]:
    """What llama-cpp-python 0.3.x yields for tool_choice naming a function (stream=True)."""
    def call(text: str) -> dict[str, Any]:
        return {"role": None, "content": None, "function_call": {"name": "get_weather", "arguments": text},
                "tool_calls": [{"index": 0, "id": CALL_ID, "type": "function",
                                "function": {"name": "get_weather", "arguments": text}}]}
    return ([_chunk({"role": "assistant", "content": None, "function_call": None, "tool_calls": None})]
            + [_chunk(call(f)) for f in fragments]
            + [_chunk({"role": None, "content": None, "function_call": None, "tool_calls": None}, "tool_calls")])


def accumulate(chunks: list[dict[str, Any]]) -> dict[int, dict[str, str]]:
    """The official SDKs' accumulation: every string field of a tool-call delta is appended."""
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for call in chunk["choices"][0]["delta"].get("tool_calls") or []:
            acc = calls.setdefault(call["index"], {"id": "", "name": "", "arguments": ""})
            acc["id"] += call.get("id") or ""
            acc["name"] += (call.get("function") or {}).get("name") or ""
            acc["arguments"] += (call.get("function") or {}).get("arguments") or ""
    return calls


def test_named_tool_stream_sends_the_call_once_then_argument_fragments() -> None:
    chunks = _llama_cpp_named_stream(['{"city": ', '"Paris"', "}"])
    assert accumulate(chunks)[0]["name"] == "get_weatherget_weatherget_weather"  # the bug, unmended
    mender = ToolCallDeltas()
    assert all(mender.mend(c) for c in chunks)
    for c in chunks:
        check("CreateChatCompletionStreamResponse", c)
        delta = c["choices"][0]["delta"]
        assert "function_call" not in delta and all(v is not None for k, v in delta.items() if k != "content")
    calls = accumulate(chunks)
    assert calls == {0: {"id": CALL_ID, "name": "get_weather", "arguments": '{"city": "Paris"}'}}
    assert chunks[2]["choices"][0]["delta"]["tool_calls"] == [{"index": 0, "function": {"arguments": '"Paris"'}}]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert chunks[-1]["choices"][0]["delta"] == {"content": None}


def test_conformant_stream_is_left_as_it_is() -> None:
    chunks = [_chunk({"role": "assistant", "content": ""}),
              _chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                      "function": {"name": "f", "arguments": ""}}]}),
              _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
              _chunk({}, "tool_calls"), _chunk({"content": "text"})]
    before = copy.deepcopy(chunks)
    mender = ToolCallDeltas()
    assert not any(mender.mend(c) for c in chunks)
    assert chunks == before


def test_two_calls_and_two_choices_are_tracked_apart() -> None:
    mender = ToolCallDeltas()
    first = {"index": 1, "id": "b", "type": "function", "function": {"name": "g", "arguments": "{"}}
    chunk = _chunk({"tool_calls": [first]})
    chunk["choices"].append({"index": 1, "finish_reason": None, "delta": {"tool_calls": [dict(first, index=1)]}})
    assert not mender.mend(chunk)  # the first sight of (choice 0, call 1) and (choice 1, call 1)
    again = _chunk({"tool_calls": [{"index": 1, "id": "b", "type": "function", "function": {"name": "g", "arguments": "}"}}]})
    assert mender.mend(again) and again["choices"][0]["delta"]["tool_calls"] == [{"index": 1, "function": {"arguments": "}"}}]


def test_completion_gets_refusal_and_loses_the_deprecated_function_call() -> None:
    body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": None, "message": {
                "role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"},
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}}]}
    assert mend_completion(body)
    check("CreateChatCompletionResponse", body)
    assert body["choices"][0]["message"]["refusal"] is None and "function_call" not in body["choices"][0]["message"]
    assert not mend_completion(body)  # mended once, conformant after
    assert json.loads(json.dumps(body)) == body
