"""`n > 1` for engines that generate one choice per request: n generations, one after another in the
request's engine slot, merged into one response (choices re-indexed, usage as OpenAI counts it: the
prompt once, every choice's completion tokens). Streams send choice 0's chunks, then choice 1's, ...
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson

from adapters.base import ChatResult, Completion, RequestContext, StreamEvent, Usage

Call = Callable[[dict[str, Any], RequestContext], Awaitable[ChatResult]]


def _body(body: dict[str, Any], i: int) -> dict[str, Any]:
    one = {**body, "n": 1}
    if isinstance(body.get("seed"), int):
        one["seed"] = body["seed"] + i  # one seed would give n copies of one answer
    return one


def _reindex(choices: list[dict[str, Any]], n: int, i: int) -> list[dict[str, Any]]:
    """Choice j of run i becomes j * n + i (j is the prompt's index for a list of prompts)."""
    return [{**c, "index": int(c.get("index", 0)) * n + i} for c in choices]


def _merge(first: Usage | None, usage: Usage | None) -> Usage | None:
    if usage is None:
        return first
    if first is None:
        return Usage(usage.prompt_tokens, usage.completion_tokens)
    return Usage(first.prompt_tokens, first.completion_tokens + usage.completion_tokens)


def n_choices(call: Call, n: int) -> Call:
    async def run(body: dict[str, Any], ctx: RequestContext) -> ChatResult:
        if body.get("stream"):
            return _stream(call, body, ctx, n)
        merged: dict[str, Any] | None = None
        usage: Usage | None = None
        for i in range(n):
            result = await call(_body(body, i), ctx)
            assert isinstance(result, Completion)
            if result.status >= 400:
                return result
            data = orjson.loads(result.body) if isinstance(result.body, bytes) else dict(result.body)
            usage = _merge(usage, result.usage)
            choices = _reindex(data.get("choices") or [], n, i)
            if merged is None:
                merged = {**data, "choices": choices}
            else:
                merged["choices"] += choices
        assert merged is not None
        merged["choices"].sort(key=lambda c: c["index"])
        if usage is not None:
            merged["usage"] = usage.as_dict()
        return Completion(merged, usage)

    return run


async def _stream(call: Call, body: dict[str, Any], ctx: RequestContext, n: int) -> AsyncIterator[StreamEvent]:
    usage: Usage | None = None
    template: dict[str, Any] = {}
    for i in range(n):
        result = await call(_body(body, i), ctx)
        assert not isinstance(result, Completion)
        events: AsyncIterator[StreamEvent] = result
        try:
            async for event in events:
                usage = _merge(usage, event.usage)
                if event.is_error:
                    yield event
                    return
                if not event.data:
                    continue
                chunk = orjson.loads(event.data)
                if not chunk.get("choices"):  # a run's own usage chunk: one merged chunk ends the stream
                    template = {k: v for k, v in chunk.items() if k not in ("choices", "usage")}
                    continue
                chunk["choices"] = _reindex(chunk["choices"], n, i)
                yield StreamEvent(orjson.dumps(chunk), event.has_content, None, event.finish_reason)
        finally:
            await events.aclose()  # type: ignore[attr-defined]
    data = orjson.dumps({**template, "choices": [], "usage": usage.as_dict()}) if ctx.include_usage and usage else b""
    yield StreamEvent(data, usage=usage)
