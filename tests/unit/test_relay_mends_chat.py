"""The relay mends an upstream's chat stream only where it deviates from OpenAI's shape. The deviating
upstream is llama-cpp-python's own server (`python -m llama_cpp.server`, an engine users put behind
`engine: openai`): its chunks are made here by llama-cpp-python's real conversion code. A conformant
upstream's events pass as its own bytes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import orjson
import pytest

from adapters.base import Completion, RequestContext, StreamEvent
from adapters.openai_http import Relay, Upstream
from tests.conformance.openai_spec import check
from tests.unit.test_chat_shape import accumulate

llama_chat_format = pytest.importorskip("llama_cpp.llama_chat_format")


class _Response:
    def __init__(self, body: bytes) -> None:
        self.status = 200
        self._pieces = [body[i:i + 97] for i in range(0, len(body), 97)] + [b""]

    async def read(self, deadline: float | None = None) -> bytes:
        return b"".join(self._pieces)

    async def read_chunk(self, deadline: float | None = None) -> bytes:
        return self._pieces.pop(0)

    def release(self) -> None: ...

    def abort(self) -> None: ...


class _Upstream:
    """An HttpClient whose every response is `body`."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    async def request(self, method: str, url: str, headers: Mapping[str, str], body: bytes | None,
                      deadline: float | None = None) -> _Response:
        return _Response(self.body)

    async def aclose(self) -> None: ...


def _llama_cpp_python_stream() -> list[dict[str, Any]]:
    def completion_chunks() -> Iterator[dict[str, Any]]:
        for text in ['{"city": ', '"Paris"', "}"]:
            yield {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
                   "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": None}]}
    return list(llama_chat_format._convert_completion_to_chat_function("get_weather", completion_chunks(), stream=True))


def _sse(chunks: list[dict[str, Any]]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


async def _relay(body: bytes) -> list[StreamEvent]:
    relay = Relay("upstream", client=_Upstream(body))
    result = await relay.forward(Upstream("http://127.0.0.1:1", ask_usage=False), "/v1/chat/completions",
                                 {"model": "m", "messages": [], "stream": True}, RequestContext("r", "m"))
    assert not isinstance(result, Completion)
    events: AsyncIterator[StreamEvent] = result
    return [e async for e in events]


async def test_a_deviating_upstream_stream_is_mended() -> None:
    upstream = _llama_cpp_python_stream()
    assert accumulate(upstream)[0]["name"] == "get_weather" * 3  # what the SDKs would build from it
    events = await _relay(_sse(upstream))
    chunks = [orjson.loads(e.data) for e in events]
    for chunk in chunks:
        check("CreateChatCompletionStreamResponse", chunk)
    assert accumulate(chunks) == {0: {"id": upstream[1]["choices"][0]["delta"]["tool_calls"][0]["id"],
                                      "name": "get_weather", "arguments": '{"city": "Paris"}'}}
    assert [e.finish_reason for e in events if e.finish_reason] == ["tool_calls"]


async def test_a_conformant_upstream_stream_passes_as_its_own_bytes() -> None:
    chunks = [{"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
              for delta, finish in [({"role": "assistant", "content": ""}, None),
                                    ({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                                      "function": {"name": "f", "arguments": ""}}]}, None),
                                    ({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}, None),
                                    ({}, "tool_calls")]]
    events = await _relay(_sse(chunks))
    assert [e.data for e in events] == [orjson.dumps(c) for c in chunks]
