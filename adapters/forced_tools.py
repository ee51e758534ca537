"""A forced `tool_choice` (`"required"` or a named function) on an engine that constrains its output to a
JSON schema but makes no tool call for this model itself (llama-server with a chat template that has no
tool syntax, such as SmolLM2's, ignores `tool_choice` and writes text).

The request becomes a plain one whose `response_format` is the function's parameter schema; the
answer's content becomes that function's call: a whole message's `tool_calls`, or, streamed, one chunk
opening the call (id, type, name) and then each content delta as an `arguments` fragment, as OpenAI
streams it. With several tools, `"required"` first lets the engine pick the name under a grammar that
admits only the names (a few tokens).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from adapters.base import Completion, StreamEvent
from adapters.chunk_rewrite import new_call_id, rewrite_chunks

PICK_MAX_TOKENS_SLACK = 4


def function_of(body: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((t["function"] for t in body.get("tools") or () if (t.get("function") or {}).get("name") == name), None)


def forced_function(body: dict[str, Any]) -> dict[str, Any] | None:
    """The function a forced tool_choice calls, when it is known without asking the model; None otherwise."""
    choice = body.get("tool_choice")
    tools = body.get("tools") or []
    if isinstance(choice, dict):
        return function_of(body, str((choice.get("function") or {}).get("name")))
    if choice == "required" and len(tools) == 1:
        return tools[0].get("function")
    return None


def needs_pick(body: dict[str, Any]) -> bool:
    return body.get("tool_choice") == "required" and len(body.get("tools") or []) > 1


def names(body: dict[str, Any]) -> list[str]:
    return [str((t.get("function") or {}).get("name")) for t in body.get("tools") or []]


def names_grammar(options: list[str]) -> str:
    """A GBNF grammar (llama.cpp's) that admits exactly one of these names."""
    return "root ::= " + " | ".join(orjson.dumps(n).decode() for n in options)


def pick_max_tokens(options: list[str]) -> int:
    return max(len(n) for n in options) + PICK_MAX_TOKENS_SLACK


def pick_request(body: dict[str, Any]) -> dict[str, Any]:
    """A short non-streamed request whose answer can only be one of the tools' names (a GBNF grammar)."""
    options = names(body)
    grammar = names_grammar(options)
    plain = {k: v for k, v in body.items()
             if k not in ("tools", "tool_choice", "parallel_tool_calls", "response_format", "stream", "stream_options", "n")}
    return {**plain, "grammar": grammar, "max_tokens": pick_max_tokens(options)}


def picked_name(result: Completion, body: dict[str, Any]) -> str:
    data = orjson.loads(result.body) if isinstance(result.body, bytes) else result.body
    content = str(((data.get("choices") or [{}])[0].get("message") or {}).get("content") or "").strip()
    options = names(body)
    return content if content in options else options[0]


def schema_request(body: dict[str, Any], fn: dict[str, Any]) -> dict[str, Any]:
    schema = fn.get("parameters") or {"type": "object"}
    plain = {k: v for k, v in body.items() if k not in ("tools", "tool_choice", "parallel_tool_calls")}
    return {**plain, "response_format": {"type": "json_schema",
                                         "json_schema": {"name": str(fn.get("name")), "schema": schema, "strict": True}}}


def _finish(reason: Any) -> Any:
    return "tool_calls" if reason == "stop" else reason


def as_tool_call(result: Completion, name: str) -> Completion:
    """A whole completion whose content is the arguments -> the message calling `name`."""
    if result.status >= 400:
        return result
    data = orjson.loads(result.body) if isinstance(result.body, bytes) else dict(result.body)
    for choice in data.get("choices") or ():
        message = choice.get("message") or {}
        arguments = message.get("content") or ""
        call = {"id": new_call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}
        choice["message"] = {**message, "content": None, "tool_calls": [call]}
        choice["finish_reason"] = _finish(choice.get("finish_reason"))
    return Completion(data, result.usage, result.status)


def as_tool_call_stream(events: AsyncIterator[StreamEvent], name: str) -> AsyncIterator[StreamEvent]:
    """A streamed completion whose content is the arguments -> the call opened once, then fragments."""
    opened: set[int] = set()
    call_id = new_call_id()

    def rewrite(chunk: dict[str, Any], event: StreamEvent) -> StreamEvent:
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            text = delta.pop("content", None)
            if text:
                index = int(choice.get("index") or 0)
                call: dict[str, Any] = {"index": 0, "function": {"arguments": text}}
                if index not in opened:
                    opened.add(index)
                    call = {"index": 0, "id": call_id, "type": "function", "function": {"name": name, "arguments": text}}
                delta["tool_calls"] = [call]
            if choice.get("finish_reason"):
                choice["finish_reason"] = _finish(choice["finish_reason"])
            choice["delta"] = delta
        return StreamEvent(orjson.dumps(chunk), event.has_content, event.usage, _finish(event.finish_reason),
                           event.is_error)

    return rewrite_chunks(events, rewrite)
