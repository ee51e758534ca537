"""A chat completion whose content is an answer in the form, rewritten into OpenAI's shape, whole and streamed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from adapters.base import Completion, StreamEvent
from adapters.tool_prompt import as_answer, as_answer_stream

CALL = '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}'


def whole(content: str, finish: str) -> Completion:
    return Completion({"choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                    "finish_reason": finish}]})


@pytest.mark.parametrize(("content", "finish", "text", "call", "reason"), [
    ('{"response": "Sunny."}', "stop", "Sunny.", None, "stop"),
    (CALL, "stop", None, ("get_weather", '{"city":"Paris"}'), "tool_calls"),
    (CALL[:60], "length", None, ("get_weather", CALL[CALL.index("{", 20):60]), "length"),  # cut: length, the partial arguments
    ('{"response": "Sun', "length", "Sun", None, "length"),
])
def test_whole(content: str, finish: str, text: str | None, call: tuple[str, str] | None, reason: str) -> None:
    out = as_answer(whole(content, finish)).body
    assert isinstance(out, dict)
    choice = out["choices"][0]
    assert choice["finish_reason"] == reason and choice["message"]["content"] == text
    if call is None:
        assert "tool_calls" not in choice["message"]
    else:
        (made,) = choice["message"]["tool_calls"]
        assert (made["function"]["name"], made["function"]["arguments"]) == call and made["id"].startswith("call_")


def chunks(pieces: list[str], finish: str) -> list[StreamEvent]:
    out = [StreamEvent(orjson.dumps({"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}))]
    out += [StreamEvent(orjson.dumps({"choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]}), True)
            for p in pieces]
    out.append(StreamEvent(orjson.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}), False,
                           finish_reason=finish))
    out.append(StreamEvent(b'{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}'))
    return out


async def _source(events: list[StreamEvent]) -> AsyncIterator[StreamEvent]:
    for event in events:
        yield event


def run(events: list[StreamEvent]) -> list[dict[str, Any]]:
    async def collect() -> list[dict[str, Any]]:
        return [orjson.loads(e.data) async for e in as_answer_stream(_source(events))]
    return asyncio.run(collect())


def test_stream_reply() -> None:
    out = run(chunks(['{"resp', 'onse": "Hel', 'lo"}'], "stop"))
    texts = [c["choices"][0]["delta"].get("content") for c in out if c["choices"]]
    assert [t for t in texts if t] == ["Hel", "lo"]
    assert out[-2]["choices"][0]["finish_reason"] == "stop" and out[-1]["choices"] == []


def test_stream_call_held_then_sent_once() -> None:
    out = run(chunks([CALL[:20], CALL[20:]], "stop"))
    calls = [c["choices"][0]["delta"]["tool_calls"] for c in out if c["choices"] and "tool_calls" in c["choices"][0]["delta"]]
    assert len(calls) == 1 and calls[0][0]["function"] == {"name": "get_weather", "arguments": '{"city":"Paris"}'}
    assert calls[0][0]["index"] == 0
    assert out[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert all(c["choices"][0]["delta"] for c in out if c["choices"] and not c["choices"][0]["finish_reason"])


def test_stream_cut_call_says_length() -> None:
    out = run(chunks([CALL[:45]], "length"))
    assert out[-2]["choices"][0]["finish_reason"] == "length"
    assert out[-2]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"] == "get_weather"
