"""Parse relayed payloads just enough for metrics: first content, usage, finish_reason, errors."""

from __future__ import annotations

from typing import Any

import orjson

from adapters.base import StreamEvent, Usage
from adapters.chat_shape import ToolCallDeltas, mend_completion
from adapters.upstream_errors import error_event, normalise_error

RESPONSES_CONTENT = frozenset({"response.output_text.delta", "response.function_call_arguments.delta",
                               "response.reasoning_text.delta", "response.refusal.delta"})
RESPONSES_END = frozenset({"response.completed", "response.incomplete"})


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _usage(obj: Any, timings: Any = None) -> Usage | None:
    """Chat usage (prompt/completion_tokens) or Responses usage (input/output_tokens), with the cached
    prompt tokens where the engine reports them (OpenAI's details, else llama-server's `timings`)."""
    if not isinstance(obj, dict):
        return None
    prompt = obj.get("prompt_tokens", obj.get("input_tokens"))
    completion = obj.get("completion_tokens", obj.get("output_tokens"))
    if not isinstance(prompt, int):
        return None
    details = obj.get("prompt_tokens_details", obj.get("input_tokens_details"))
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
    prefill = None
    if isinstance(timings, dict):
        cached = _count(timings.get("cache_n")) if cached is None else cached
        ms = timings.get("prompt_ms")
        prefill = ms / 1000 if isinstance(ms, (int, float)) and not isinstance(ms, bool) and ms >= 0 else None
    return Usage(prompt, completion if isinstance(completion, int) else 0, cached, prefill)


def _observe_responses(payload: bytes, obj: dict[str, Any], kind: str) -> StreamEvent:
    """A native Responses event (every one has `type` and `sequence_number`): passed through as it is;
    `response.failed` ends the stream as an error, completed/incomplete carry the usage."""
    if kind == "response.failed":
        return StreamEvent(payload, is_error=True, finish_reason="failed")
    if kind in RESPONSES_END:
        response = obj.get("response")
        usage = _usage(response.get("usage")) if isinstance(response, dict) else None
        return StreamEvent(payload, usage=usage, finish_reason=kind.removeprefix("response."))
    return StreamEvent(payload, has_content=kind in RESPONSES_CONTENT)


def observe(payload: bytes, drop_usage: bool, tool_deltas: ToolCallDeltas | None = None) -> StreamEvent:
    """Parse one event just enough for metrics; `data` stays the upstream's bytes, unless a chat chunk
    deviates from OpenAI's shape (`tool_deltas` given): then the mended chunk is sent instead."""
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return error_event(f"the engine sent a malformed stream event: {payload[:200]!r}", "upstream_malformed")
    if not isinstance(obj, dict):
        return error_event(f"the engine sent a malformed stream event: {payload[:200]!r}", "upstream_malformed")
    choices = obj.get("choices")
    kind = obj.get("type")
    if choices is None and "sequence_number" in obj and isinstance(kind, str):
        return _observe_responses(payload, obj, kind)
    if "error" in obj or obj.get("object") == "error" or (choices is None and "message" in obj and "usage" not in obj):
        status = obj.get("code") if isinstance(obj.get("code"), int) else 500
        return StreamEvent(orjson.dumps(normalise_error(status, obj)), is_error=True)
    usage = _usage(obj.get("usage"), obj.get("timings"))
    has_content = False
    mendable = False  # a delta the mender may change: tool calls, or a null where OpenAI sends nothing
    finish: str | None = None
    if isinstance(choices, list):
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                if delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content") or delta.get("reasoning"):
                    has_content = True
                if "tool_calls" in delta or "function_call" in delta or ("role" in delta and delta["role"] is None):
                    mendable = True
            elif choice.get("text"):
                has_content = True
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    if drop_usage and usage is not None and not choices:
        return StreamEvent(b"", usage=usage)
    if mendable and tool_deltas is not None and tool_deltas.mend(obj):
        payload = orjson.dumps(obj)
    return StreamEvent(payload, has_content, usage, finish)


def split_usage(event: StreamEvent, drop_usage: bool) -> list[StreamEvent]:
    """OpenAI sends usage in its own last chunk (`choices: []`); an engine that puts it on the finishing
    chunk instead (llama-server's text completions) is split into that chunk and the usage chunk
    (observe-only when the client did not ask for usage)."""
    if event.usage is None or not event.data or b'"choices":[]' in event.data:
        return [event]
    obj = orjson.loads(event.data)
    if not obj.get("choices"):
        return [event]
    usage = obj.pop("usage")
    head = {k: obj[k] for k in ("id", "object", "created", "model") if k in obj}
    usage_data = b"" if drop_usage else orjson.dumps({**head, "choices": [], "usage": usage})
    return [StreamEvent(orjson.dumps(obj), event.has_content, None, event.finish_reason),
            StreamEvent(usage_data, usage=event.usage)]


def mend_chat_body(body: bytes) -> tuple[bytes, Usage | None]:
    """A relayed chat completion in OpenAI's shape (re-serialised only if it deviated), and its usage."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body, None
    if not isinstance(obj, dict):
        return body, None
    if mend_completion(obj):
        body = orjson.dumps(obj)
    return body, _usage(obj.get("usage"), obj.get("timings"))


_SMALL_BODY = 64 * 1024


def extract_usage(body: bytes) -> Usage | None:
    """Usage from a whole response; in a large one (embeddings) only the `usage` object is parsed."""
    at = body.rfind(b'"usage"') if len(body) > _SMALL_BODY else -1
    if at >= 0:
        start = body.find(b"{", at)
        if start >= 0:
            depth = 0
            for end in range(start, min(len(body), start + 4096)):
                ch = body[end]
                if ch == 0x7B:
                    depth += 1
                elif ch == 0x7D:
                    depth -= 1
                    if depth == 0:
                        try:
                            return _usage(orjson.loads(body[start:end + 1]))
                        except orjson.JSONDecodeError:
                            break
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return _usage(obj.get("usage"), obj.get("timings")) if isinstance(obj, dict) else None
