"""Fields the gateway does not implement, refused as the API refuses them rather than silently ignored.

A client that sends `background: true` or `thinking` and gets an ordinary answer cannot tell that its
request was not honoured; a 400 naming the field can. One table, `REFUSALS`, says which field of which
API is refused, when, and with which `code`; docs/reference/refusals.md is generated from it.

The rule for the code: `unsupported_parameter` where the API defines the field and the gateway does not
do it (yet); `invalid_value` where the request contradicts itself (OpenAI's own answer there).

Pure functions of the raw request body (run before it is parsed, so a server tool is named as such and
not as a missing `input_schema`); they raise `APIError`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gateway.api.errors import APIError

Api = Literal["chat", "completions", "responses", "messages"]
UNSUPPORTED = "unsupported_parameter"
INVALID = "invalid_value"
CLIENT_TOOL_TYPES = (None, "custom")
"""Anthropic's client tools: no `type`, or `custom`; every other type is one of Anthropic's server tools."""


Found = tuple[str, str]
"""(param, message)."""


@dataclass(frozen=True)
class Refusal:
    api: Api
    field: str
    when: str
    """When the field is refused, in words (the docs' column)."""
    code: str
    test: Callable[[Mapping[str, Any]], Found | None]
    """The body -> the refused `param` and why (None: not refused)."""


def _modalities(body: Mapping[str, Any]) -> Found | None:
    value = body.get("modalities")
    if value is None or value == ["text"]:
        return None
    others = [m for m in value if m != "text"] if isinstance(value, list) else [value]
    return "modalities", f"modalities {others!r} are not supported: this gateway answers text only (modalities: ['text'])"


def _audio(body: Mapping[str, Any]) -> Found | None:
    return None if body.get("audio") is None else ("audio", "audio output is not supported: this gateway answers text only")


def _background(body: Mapping[str, Any]) -> Found | None:
    if body.get("background") in (None, False):
        return None
    return "background", "background responses are not supported: send the request without background (it runs while you wait)"


def _conversation(body: Mapping[str, Any]) -> Found | None:
    if body.get("conversation") is None:
        return None
    return "conversation", ("conversations are not supported: chain responses with previous_response_id, "
                            "or send the earlier items in input")


LOGPROBS_INCLUDE = "message.output_text.logprobs"


def _include(body: Mapping[str, Any]) -> Found | None:
    include = body.get("include")
    if isinstance(include, list) and LOGPROBS_INCLUDE in include:
        return "include", f"include {LOGPROBS_INCLUDE!r} is not supported by the Responses API here (no logprobs on output text)"
    return None


def _suffix(body: Mapping[str, Any]) -> Found | None:
    if body.get("suffix") in (None, ""):
        return None
    return "suffix", "suffix (insertion after the completion) is not supported: send the prompt alone"


def _best_of_below_n(body: Mapping[str, Any]) -> Found | None:
    best_of, n = body.get("best_of"), body.get("n") or 1
    if isinstance(best_of, int) and isinstance(n, int) and best_of < n:
        return "best_of", f"best_of ({best_of}) must be greater than or equal to n ({n})"
    return None


def _best_of(body: Mapping[str, Any]) -> Found | None:
    best_of, n = body.get("best_of"), body.get("n") or 1
    if best_of is None or not isinstance(n, int) or best_of == n:
        return None
    if isinstance(best_of, int) and best_of < n:
        return None  # the invalid_value row
    return "best_of", (f"best_of {best_of!r} is not supported (no server-side choice among candidates): "
                       f"send n={best_of} and pick yourself, or best_of equal to n")


def _thinking(body: Mapping[str, Any]) -> Found | None:
    thinking = body.get("thinking")
    if thinking is None or (isinstance(thinking, Mapping) and thinking.get("type") == "disabled"):
        return None
    return "thinking", "extended thinking is not supported by this gateway: send the request without thinking"


def _server_tool(body: Mapping[str, Any]) -> Found | None:
    tools = body.get("tools")
    if not isinstance(tools, list):
        return None
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        if kind not in CLIENT_TOOL_TYPES:
            return f"tools.{i}.type", (f"tools.{i}: server tools ({kind}) are not supported: this gateway serves "
                                       "client tools only (name, description, input_schema), which your code runs")
    return None


REFUSALS: tuple[Refusal, ...] = (
    Refusal("chat", "modalities", "anything but `[\"text\"]`", UNSUPPORTED, _modalities),
    Refusal("chat", "audio", "present", UNSUPPORTED, _audio),
    Refusal("responses", "background", "`true`", UNSUPPORTED, _background),
    Refusal("responses", "conversation", "present", UNSUPPORTED, _conversation),
    Refusal("responses", "include", f"holds `{LOGPROBS_INCLUDE}`", UNSUPPORTED, _include),
    Refusal("completions", "suffix", "a non-empty string", UNSUPPORTED, _suffix),
    Refusal("completions", "best_of", "below `n`", INVALID, _best_of_below_n),
    Refusal("completions", "best_of", "above `n` (`best_of: 1`, or equal to `n`, is served)", UNSUPPORTED, _best_of),
    Refusal("messages", "thinking", "anything but `{\"type\": \"disabled\"}`", UNSUPPORTED, _thinking),
    Refusal("messages", "tools[].type", "a server tool (`web_search_20250305`, `bash_20250124`, ...)", UNSUPPORTED,
            _server_tool),
)
"""Every refused field. Checked elsewhere, with the same codes: `tool_choice: "required"` without tools and a
named `tool_choice` not in `tools` (invalid_value), a custom (non-function) chat tool (invalid_value), a
schema that is not a JSON Schema (invalid_json_schema, invalid_function_parameters): api/tool_checks.py."""


def refuse(api: Api) -> Callable[[Mapping[str, Any]], None]:
    """The check of one API's raw body: the first refused field -> 400 with its `param` and `code`."""
    rows = [r for r in REFUSALS if r.api == api]

    def check(body: Mapping[str, Any]) -> None:
        for row in rows:
            found = row.test(body)
            if found is not None:
                param, message = found
                raise APIError(400, message, param=param, code=row.code)

    return check
