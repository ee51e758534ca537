"""The requested name in an answer the engine wrote under another one: a LoRA adapter's response carries the
adapter's name in `model` even where the engine answers with its base's (llama-server names its alias, SGLang
the model id the request went under). Used only for such requests, so a base model's bytes pass untouched.

Every chunk (chat, completions) and Responses event (`response.model`) is rewritten; an event that carries no
`model` key (an error, a Responses delta) passes as it came."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from adapters.base import Completion, StreamEvent

_KEY = b'"model"'


def _renamed(obj: Any, name: str) -> bool:
    changed = False
    if isinstance(obj, dict):
        if "model" in obj and obj["model"] != name:
            obj["model"] = name
            changed = True
        inner = obj.get("response")  # a Responses event wraps the response object
        if isinstance(inner, dict) and "model" in inner and inner["model"] != name:
            inner["model"] = name
            changed = True
    return changed


def renamed_json(raw: bytes, name: str) -> bytes:
    if _KEY not in raw:
        return raw
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw
    return orjson.dumps(obj) if _renamed(obj, name) else raw


def renamed_completion(result: Completion, name: str) -> Completion:
    if result.status >= 400:
        return result
    if isinstance(result.body, bytes):
        result.body = renamed_json(result.body, name)
    else:
        _renamed(result.body, name)
    return result


async def renamed_events(events: AsyncIterator[StreamEvent], name: str) -> AsyncIterator[StreamEvent]:
    try:
        async for event in events:
            if event.data and not event.is_error:
                event.data = renamed_json(event.data, name)
            yield event
    finally:
        close = getattr(events, "aclose", None)
        if close is not None:
            await close()


def renamed(result: Completion | AsyncIterator[StreamEvent], name: str) -> Completion | AsyncIterator[StreamEvent]:
    if isinstance(result, Completion):
        return renamed_completion(result, name)
    return renamed_events(result, name)
