"""The tool call a forced tool_choice makes in the emulator (chat and Responses)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import orjson

Json = dict[str, Any]


class ToolChoiceError(ValueError):
    """tool_choice names a function that is not in tools."""


@dataclass(frozen=True)
class ToolCallPlan:
    """The call a forced tool_choice produces (engines with structured outputs, e.g. vLLM, constrain the
    output to it): the named function, or for "required" the first one; each required string
    property of its parameters gets the value ``tok0``."""

    call_id: str
    name: str
    arguments: str

    def fragments(self) -> list[str]:
        """The arguments as an engine streams them: a few pieces that join to the whole."""
        cut = [0, len(self.arguments) // 3, 2 * len(self.arguments) // 3, len(self.arguments)]
        return [self.arguments[a:b] for a, b in zip(cut, cut[1:]) if b > a]


def forced_tool(body: Json) -> ToolCallPlan | None:
    tools = [t.get("function") or {} for t in body.get("tools") or [] if isinstance(t, dict)]
    choice = body.get("tool_choice")
    if not tools or choice in (None, "auto", "none"):
        return None
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        fn = next((t for t in tools if t.get("name") == name), None)
        if fn is None:
            raise ToolChoiceError(f"tool_choice names {name!r}, which is not in tools")
    elif choice == "required":
        fn = tools[0]
    else:
        raise ToolChoiceError(f"unknown tool_choice {choice!r}")
    params = fn.get("parameters") or {}
    args = {k: "tok0" for k in params.get("required") or [] if (params.get("properties") or {}).get(k, {}).get("type") == "string"}
    return ToolCallPlan("call_" + uuid.uuid4().hex[:24], str(fn.get("name")), orjson.dumps(args).decode())



def forced_responses_tool(body: Json) -> ToolCallPlan | None:
    """The same for a Responses request (flat function tools, tool_choice {"type": "function", "name"})."""
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    tools = [{"type": "function", "function": t} for t in body.get("tools") or [] if t.get("type") == "function"]
    return forced_tool({"tools": tools, "tool_choice": choice})
