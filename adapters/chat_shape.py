"""OpenAI's chat wire shape, where engines deviate from it: mended in place, reporting whether anything changed.

What OpenAI sends and strict clients rely on (the spec's ChatCompletionResponseMessage and
ChatCompletionStreamResponseDelta, and the official SDKs' stream accumulators):
- every message has `refusal` and every choice `logprobs` (null when there is none);
- a tool call streams as one chunk with `index`, `id`, `type` and `function.name` (and maybe the first
  `arguments`), then chunks with only `index` and `function.arguments` fragments. An accumulator joins
  every string it is sent, so a name repeated in each chunk becomes `get_weatherget_weather`;
- a field with no value is absent, not `null` (`role`, `tool_calls`, `function_call` are not nullable);
- no deprecated `function_call` beside `tool_calls`.

Callers re-serialise only when `mend_*` returns True, so a conformant engine's bytes pass untouched.
"""

from __future__ import annotations

from typing import Any

_NOT_NULLABLE_DELTA = ("role", "tool_calls", "function_call")


def mend_message(message: dict[str, Any]) -> bool:
    changed = False
    if "refusal" not in message:
        message["refusal"] = None
        changed = True
    if message.get("tool_calls"):
        if "function_call" in message:
            del message["function_call"]
            changed = True
    elif "tool_calls" in message and not message["tool_calls"]:
        del message["tool_calls"]  # null or [] where the spec wants an absent field
        changed = True
    if "function_call" in message and message["function_call"] is None:
        del message["function_call"]
        changed = True
    return changed


def mend_logprobs(choice: dict[str, Any]) -> bool:
    """Chat logprobs as OpenAI's ChatCompletionTokenLogprob: `refusal` beside `content`, no engine extras
    (llama-server adds each token's `id`, which the spec's closed objects refuse)."""
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return False
    changed = False
    if "refusal" not in lp:
        lp["refusal"] = None
        changed = True
    for entry in lp.get("content") or ():
        for item in (entry, *(entry.get("top_logprobs") or ())):
            if isinstance(item, dict) and "id" in item:
                del item["id"]
                changed = True
    return changed


def mend_completion(body: dict[str, Any]) -> bool:
    """A whole chat completion: every choice's message mended."""
    changed = False
    for choice in body.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if "logprobs" not in choice:  # required (nullable) in every choice; llama-server leaves it out
            choice["logprobs"] = None
            changed = True
        changed = mend_logprobs(choice) or changed
        message = choice.get("message")
        if isinstance(message, dict):
            changed = mend_message(message) or changed
    return changed


class ToolCallDeltas:
    """One chat stream's chunks, mended in order: remembers which tool calls were already opened."""

    __slots__ = ("_opened",)

    def __init__(self) -> None:
        self._opened: set[tuple[int, int]] = set()

    def mend(self, chunk: dict[str, Any]) -> bool:
        changed = False
        for choice in chunk.get("choices") or ():
            if isinstance(choice, dict):
                changed = mend_logprobs(choice) or changed
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if isinstance(delta, dict):
                changed = self._delta(int(choice.get("index") or 0), delta) or changed
        return changed

    def _delta(self, choice: int, delta: dict[str, Any]) -> bool:
        changed = False
        for key in _NOT_NULLABLE_DELTA:
            if key in delta and delta[key] is None:
                del delta[key]
                changed = True
        calls = delta.get("tool_calls")
        if calls is None:
            return changed
        if "function_call" in delta:  # the deprecated twin of tool_calls
            del delta["function_call"]
            changed = True
        for position, call in enumerate(calls):
            if isinstance(call, dict):
                changed = self._call(choice, position, call) or changed
        return changed

    def _call(self, choice: int, position: int, call: dict[str, Any]) -> bool:
        changed = False
        if "index" not in call:
            call["index"] = position
            changed = True
        key = (choice, int(call["index"]))
        fn = call.get("function")
        if key in self._opened:
            for field in ("id", "type"):
                if field in call:
                    del call[field]
                    changed = True
            if isinstance(fn, dict) and "name" in fn:
                del fn["name"]
                changed = True
        else:
            self._opened.add(key)
            for field in ("id", "type"):
                if field in call and call[field] is None:
                    del call[field]
                    changed = True
            if isinstance(fn, dict) and "name" in fn and fn["name"] is None:
                del fn["name"]
                changed = True
        if isinstance(fn, dict) and "arguments" in fn and fn["arguments"] is None:
            del fn["arguments"]
            changed = True
        if fn is None and "function" in call:
            del call["function"]
            changed = True
        return changed
