"""The requested name in an answer the engine wrote under another one: a LoRA adapter's response carries the
adapter's name in `model` even where the engine answers with its base's (llama-server names its alias, SGLang
the model id the request went under). Used only for such requests, so a base model's bytes pass untouched.

Every chunk (chat, completions) and Responses event (`response.model`) is rewritten; an event that carries no
`model` key (an error, a Responses delta) passes as it came. Where the engine's compact `"model":"<its name>"`
is in the bytes, it is replaced in place (in JSON text that sequence can only be a key and its value: inside
a string every quote is escaped, so `model` is never followed by a bare quote there); otherwise the event
is parsed and written again."""

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


def _pair(name: str, engine_name: str | None) -> tuple[bytes, bytes] | None:
    if engine_name is None or engine_name == name:
        return None
    return _KEY + b":" + orjson.dumps(engine_name), _KEY + b":" + orjson.dumps(name)


def renamed_json(raw: bytes, name: str, engine_name: str | None = None,
                 pair: tuple[bytes, bytes] | None = None) -> bytes:
    """`raw` with `model` (and a Responses event's `response.model`) set to `name`; `engine_name`: the name
    the engine answers with, whose compact form is replaced without parsing."""
    pair = pair or _pair(name, engine_name)
    if pair is not None and pair[0] in raw:
        return raw.replace(*pair)
    if _KEY not in raw:
        return raw
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw
    return orjson.dumps(obj) if _renamed(obj, name) else raw


def renamed_completion(result: Completion, name: str, engine_name: str | None = None) -> Completion:
    if result.status >= 400:
        return result
    if isinstance(result.body, bytes):
        result.body = renamed_json(result.body, name, engine_name)
    else:
        _renamed(result.body, name)
    return result


async def renamed_events(events: AsyncIterator[StreamEvent], name: str,
                         engine_name: str | None = None) -> AsyncIterator[StreamEvent]:
    pair = _pair(name, engine_name)
    try:
        async for event in events:
            if event.data and not event.is_error:
                event.data = renamed_json(event.data, name, pair=pair)
            yield event
    finally:
        close = getattr(events, "aclose", None)
        if close is not None:
            await close()


def renamed(result: Completion | AsyncIterator[StreamEvent], name: str,
            engine_name: str | None = None) -> Completion | AsyncIterator[StreamEvent]:
    if isinstance(result, Completion):
        return renamed_completion(result, name, engine_name)
    return renamed_events(result, name, engine_name)
