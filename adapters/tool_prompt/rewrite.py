"""A chat completion (whole or streamed) whose content is an answer in the form -> OpenAI's own shape:
the reply as `content`, a call as `tool_calls` with `finish_reason: "tool_calls"` (`length` stays `length`:
a call cut by the token limit says so)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from adapters.base import Completion, StreamEvent
from adapters.chunk_rewrite import new_call_id, rewrite_chunks
from adapters.tool_prompt.answer import AnswerStream, Parsed, parse_answer


def _finish(reason: Any, parsed: Parsed) -> Any:
    return "tool_calls" if parsed.calls and reason == "stop" else reason


def _calls(parsed: Parsed, streamed: bool) -> list[dict[str, Any]]:
    return [{**({"index": i} if streamed else {}), "id": new_call_id(), "type": "function",
             "function": {"name": name, "arguments": arguments}} for i, (name, arguments) in enumerate(parsed.calls)]


def as_answer(result: Completion) -> Completion:
    if result.status >= 400:
        return result
    data = orjson.loads(result.body) if isinstance(result.body, bytes) else dict(result.body)
    for choice in data.get("choices") or ():
        message = choice.get("message") or {}
        parsed = parse_answer(str(message.get("content") or ""))
        if parsed.calls:
            choice["message"] = {**message, "content": None, "tool_calls": _calls(parsed, streamed=False)}
        else:
            choice["message"] = {**message, "content": parsed.text}
        choice["finish_reason"] = _finish(choice.get("finish_reason"), parsed)
    return Completion(data, result.usage, result.status)


def as_answer_stream(events: AsyncIterator[StreamEvent]) -> AsyncIterator[StreamEvent]:
    """Each choice's content through an AnswerStream: reply text as it decodes, a call when the choice ends."""
    answers: dict[int, AnswerStream] = {}

    def rewrite(chunk: dict[str, Any], event: StreamEvent) -> StreamEvent | None:
        has_content = False
        finish = event.finish_reason
        for choice in chunk.get("choices") or ():
            answer = answers.setdefault(int(choice.get("index") or 0), AnswerStream())
            delta = choice.get("delta") or {}
            text = answer.feed(str(delta.pop("content", None) or ""))
            if choice.get("finish_reason"):
                tail, parsed = answer.finish()
                text += tail
                if parsed.calls:
                    delta["tool_calls"] = _calls(parsed, streamed=True)
                choice["finish_reason"] = finish = _finish(choice["finish_reason"], parsed)
            if text:
                delta["content"] = text
            choice["delta"] = delta
            has_content = has_content or bool(text or delta.get("tool_calls"))
        if not has_content and not finish and event.usage is None and not any(
                c.get("delta") for c in chunk.get("choices") or ()):
            return None  # a held call's fragment: nothing to send yet
        return StreamEvent(orjson.dumps(chunk), has_content, event.usage, finish, event.is_error)

    return rewrite_chunks(events, rewrite)
