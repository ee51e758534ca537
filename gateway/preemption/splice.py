"""One client stream out of a preempted request's segments.

`Splice.take(event)` reads each chunk: in the first segment it only notes the text, the tokens sent (one
per content chunk, as engines stream them) and the chunk's id and created time, and passes the event on
unchanged; in a resumed segment it rewrites the chunk to the first segment's id and created time, drops the
role a new response announces (and a chunk left empty by that), and reports usage as the client's one
request: completion tokens are those sent before the cut plus the last segment's, prompt tokens the last
segment's less the text it was given back (its total is the engine's, unchanged). A chunk carrying anything
a resume would lose (reasoning, a tool call) makes the stream `resumable` no more."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson

from adapters.base import Operation, StreamEvent, Usage

_TEXT_ONLY = frozenset({"role", "content"})


class Splice:
    def __init__(self, operation: Operation) -> None:
        self.chat = operation == "chat"
        self.parts: list[str] = []
        self.produced = 0
        """Content chunks sent so far: the tokens the resume's max_tokens loses."""
        self.resumable = True
        self.finished = False
        """A choice's finish_reason came: nothing is left to resume."""
        self.segments = 1
        self._id: Any = None
        self._created: Any = None
        self._before = 0
        """Tokens sent before the current segment began."""

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def can_resume(self) -> bool:
        return self.resumable and not self.finished

    def resumed(self) -> None:
        """A new segment begins (its events are rewritten)."""
        self.segments += 1
        self._before = self.produced

    def take(self, event: StreamEvent) -> StreamEvent | None:
        """The event as the client gets it; None: drop it."""
        if event.is_error or (self.segments == 1 and not self.can_resume):
            return event  # a first segment that can no longer be cut only passes on: nothing to note
        chunk = _chunk(event.data)
        if chunk is not None:
            self._note(chunk)
        if self.segments == 1:
            return event
        usage = self._usage(event.usage)
        if chunk is None:
            return replace(event, usage=usage) if usage is not event.usage else event
        if not self._rewrite(chunk, usage):
            return None
        return replace(event, data=orjson.dumps(chunk), usage=usage)

    def _note(self, chunk: dict[str, Any]) -> None:
        if self._id is None:
            self._id, self._created = chunk.get("id"), chunk.get("created")
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            if choice.get("finish_reason") is not None:
                self.finished = True
            text = self._text_of(choice)
            if text:
                self.parts.append(text)
                self.produced += 1

    def _text_of(self, choice: dict[str, Any]) -> str | None:
        if not self.chat:
            text = choice.get("text")
            if choice.get("logprobs") is not None:
                self.resumable = False
            return text if isinstance(text, str) else None
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return None
        if any(v not in (None, "", []) for k, v in delta.items() if k not in _TEXT_ONLY) or choice.get("logprobs"):
            self.resumable = False  # reasoning, tool calls, logprobs: text alone would not carry them on
        content = delta.get("content")
        return content if isinstance(content, str) else None

    def _rewrite(self, chunk: dict[str, Any], usage: Usage | None) -> bool:
        """The resumed segment's chunk in the first segment's terms; False: nothing is left of it."""
        if self._id is not None:
            chunk["id"] = self._id
        if self._created is not None:
            chunk["created"] = self._created
        carries = False
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            if self.chat and isinstance(delta, dict):
                delta.pop("role", None)
                if delta.get("content") in (None, "") and len(delta) <= 1 and choice.get("finish_reason") is None:
                    continue
            elif not self.chat and choice.get("text") in (None, "") and choice.get("finish_reason") is None:
                continue
            carries = True
        if isinstance(chunk.get("usage"), dict) and usage is not None:
            chunk["usage"] = {**chunk["usage"], **usage.as_dict()}
            carries = True
        return carries

    def _usage(self, usage: Usage | None) -> Usage | None:
        if usage is None:
            return None
        given_back = self._before
        cached = usage.cached_tokens
        prompt = max(0, usage.prompt_tokens - given_back)
        return Usage(prompt, usage.completion_tokens + given_back, None if cached is None else min(cached, prompt),
                     usage.prefill_seconds)


def _chunk(data: bytes) -> dict[str, Any] | None:
    if not data:
        return None
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return chunk if isinstance(chunk, dict) else None
