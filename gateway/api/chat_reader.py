"""Reads what every adapter speaks (OpenAI chat completions and their stream chunks) into neutral parts.

The translated APIs (Responses, Anthropic Messages) are written from these parts, so the engine,
the relay and the chat serving path stay the only ones that know the chat wire form.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson

from adapters.base import Completion, StreamEvent, Usage


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str = ""


@dataclass(slots=True)
class ChatOutput:
    """A whole chat completion (its first choice)."""

    text: str
    tool_calls: list[ToolCall]
    finish_reason: str | None
    usage: Usage | None


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    index: int
    call: ToolCall


@dataclass(frozen=True, slots=True)
class ToolArgsDelta:
    index: int
    arguments: str


Part = TextDelta | ToolCallStart | ToolArgsDelta


def _json(body: dict[str, Any] | bytes) -> dict[str, Any]:
    data = orjson.loads(body) if isinstance(body, bytes) else body
    return data if isinstance(data, dict) else {}


def _usage(raw: Any) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    return Usage(prompt_tokens=int(raw.get("prompt_tokens") or 0), completion_tokens=int(raw.get("completion_tokens") or 0))


def read_completion(result: Completion) -> ChatOutput:
    body = _json(result.body)
    choices = body.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    calls = []
    for raw in message.get("tool_calls") or []:
        fn = raw.get("function") or {}
        calls.append(ToolCall(id=raw.get("id") or new_id("call"), name=fn.get("name") or "", arguments=fn.get("arguments") or ""))
    content = message.get("content")
    text = content if isinstance(content, str) else ""
    usage = result.usage or _usage(body.get("usage"))
    return ChatOutput(text=text, tool_calls=calls, finish_reason=choice.get("finish_reason"), usage=usage)


def error_message(data: bytes) -> tuple[str, str | None]:
    """An engine's in-stream error event (OpenAI shape) as (message, code)."""
    try:
        err = orjson.loads(data).get("error") or {}
    except (orjson.JSONDecodeError, AttributeError):
        return "engine stream failed", None
    return str(err.get("message") or "engine stream failed"), err.get("code")


@dataclass(slots=True)
class ChunkReader:
    """Reads one chat stream, chunk by chunk; keeps the whole text, the calls, the finish reason and usage."""

    text: str = ""
    calls: dict[int, ToolCall] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: Usage | None = None

    def read(self, event: StreamEvent) -> list[Part]:
        if event.usage is not None:
            self.usage = event.usage
        if not event.data or event.is_error:
            return []
        chunk = orjson.loads(event.data)
        if self.usage is None and chunk.get("usage"):
            self.usage = _usage(chunk["usage"])
        parts: list[Part] = []
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str) and delta["content"]:
                self.text += delta["content"]
                parts.append(TextDelta(delta["content"]))
            for raw in delta.get("tool_calls") or []:
                parts.extend(self._tool_delta(raw))
        return parts

    def _tool_delta(self, raw: dict[str, Any]) -> list[Part]:
        index = int(raw.get("index", len(self.calls)))
        fn = raw.get("function") or {}
        parts: list[Part] = []
        call = self.calls.get(index)
        if call is None:
            call = self.calls[index] = ToolCall(id=raw.get("id") or new_id("call"), name=fn.get("name") or "")
            parts.append(ToolCallStart(index, call))
        arguments = fn.get("arguments")
        if isinstance(arguments, str) and arguments:
            call.arguments += arguments
            parts.append(ToolArgsDelta(index, arguments))
        return parts

    def output(self) -> ChatOutput:
        return ChatOutput(self.text, [self.calls[i] for i in sorted(self.calls)], self.finish_reason, self.usage)
