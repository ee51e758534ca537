"""The adapter's name written into answers an engine gave under its base's name (adapters/model_name.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest

from adapters.base import Completion, StreamEvent
from adapters.model_name import renamed, renamed_json


@pytest.mark.parametrize(("raw", "want"), [
    (b'{"id":"c1","model":"base","choices":[]}', {"id": "c1", "model": "tone", "choices": []}),
    # a Responses event: the response object inside it
    (b'{"type":"response.created","response":{"id":"r","model":"base"}}',
     {"type": "response.created", "response": {"id": "r", "model": "tone"}}),
    # the text naming "model" is content, not the key: escaped quotes, left as it is
    (b'{"model":"tone","choices":[{"delta":{"content":"\\"model\\":\\"base\\""}}]}', None),
    (b'{"type":"response.output_text.delta","delta":"hi"}', None),  # no model: untouched
    (b'not json "model"', None),
    (b'["model"]', None),
])
def test_renamed_json(raw: bytes, want: object) -> None:
    out = renamed_json(raw, "tone")
    if want is None:
        assert out is raw
    else:
        assert orjson.loads(out) == want


def test_a_whole_answer_and_not_an_error() -> None:
    ok = renamed(Completion(body=b'{"model":"base"}'), "tone")
    assert isinstance(ok, Completion) and orjson.loads(ok.body) == {"model": "tone"}  # type: ignore[arg-type]
    parsed = renamed(Completion(body={"model": "base"}), "tone")
    assert isinstance(parsed, Completion) and parsed.body == {"model": "tone"}
    failed = renamed(Completion(body=b'{"error":{"model":"base"}}', status=400), "tone")
    assert isinstance(failed, Completion) and failed.body == b'{"error":{"model":"base"}}'


def test_every_chunk_of_a_stream_and_its_close_reaches_the_engine() -> None:
    closed: list[bool] = []

    async def events() -> AsyncIterator[StreamEvent]:
        try:
            yield StreamEvent(b'{"model":"base","choices":[{"delta":{"content":"a"}}]}', has_content=True)
            yield StreamEvent(b"")  # observe-only
            yield StreamEvent(b'{"error":{"message":"x"}}', is_error=True)
            yield StreamEvent(b'{"model":"base","choices":[]}')
        finally:
            closed.append(True)

    async def run() -> list[bytes]:
        out = renamed(events(), "tone")
        assert not isinstance(out, Completion)
        return [e.data async for e in out]

    got = asyncio.run(run())
    assert [orjson.loads(d) if d else d for d in got] == [
        {"model": "tone", "choices": [{"delta": {"content": "a"}}]}, b"", {"error": {"message": "x"}},
        {"model": "tone", "choices": []}]
    assert closed == [True]

    async def abandon() -> None:  # the client leaves after the first chunk: the engine's stream is closed
        out = renamed(events(), "tone")
        assert not isinstance(out, Completion)
        async for _ in out:
            break
        await out.aclose()  # type: ignore[attr-defined]

    closed.clear()
    asyncio.run(abandon())
    assert closed == [True]


@pytest.mark.parametrize("raw", [
    b'{"id":"c1","model":"base","choices":[{"delta":{"content":"hi"}}]}',
    b'{"id":"c1","model":"base","choices":[{"delta":{"content":"\\"model\\":\\"base\\""}}]}',  # quoted in text
    b'{"id":"c1","model": "base","choices":[]}',  # not compact: parsed instead
    b'{"type":"response.completed","response":{"model":"base","output":[]}}',
])
def test_the_engines_compact_name_is_replaced_in_place_with_the_same_result(raw: bytes) -> None:
    fast, parsed = renamed_json(raw, "tone", "base"), renamed_json(raw, "tone")
    assert orjson.loads(fast) == orjson.loads(parsed)
    assert b'\\"model\\":\\"base\\"' not in raw or b'\\"model\\":\\"base\\"' in fast  # the text is left alone
