"""The tool definitions as a system-message block, earlier calls and results as text the template can
render, and the JSON schema of an answer in the form (the engine's grammar holds the model to it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def _functions(tools: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for tool in tools:
        fn = tool.get("function") or {}
        out.append({"name": fn.get("name"), **({"description": fn["description"]} if fn.get("description") else {}),
                    "parameters": fn.get("parameters") or EMPTY_PARAMETERS})
    return out


def tools_block(tools: Sequence[dict[str, Any]]) -> str:
    """What the model reads when it may call a tool or answer in words (`tool_choice: auto`)."""
    listed = "\n".join(orjson.dumps(f).decode() for f in _functions(tools))
    return ("You can call these tools (JSON Schema parameters):\n<tools>\n" + listed + "\n</tools>\n"
            "Respond in JSON, either with `tool_call` (a request to call a tool) or with `response` (your reply "
            "to the user):\n"
            '{"tool_call": {"name": "<tool name>", "arguments": {<its arguments>}}}\n'
            'or\n{"response": "<your reply>"}')


def args_instruction(tools: Sequence[dict[str, Any]], name: str) -> str:
    """What the model reads when it must call `name` (a forced tool_choice): its answer is the arguments."""
    fn = next((f for f in _functions(tools) if f["name"] == name), {"name": name, "parameters": EMPTY_PARAMETERS})
    return ("Call this tool (JSON Schema parameters):\n<tools>\n" + orjson.dumps(fn).decode() + "\n</tools>\n"
            f"Respond with the arguments of the call to `{name}` only, as one JSON object.")


def _call_text(call: dict[str, Any]) -> str:
    fn = call.get("function") or {}
    raw = fn.get("arguments") or "{}"
    try:
        arguments: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        arguments = raw
    return orjson.dumps({"tool_call": {"name": fn.get("name"), "arguments": arguments}}).decode()


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def render_messages(messages: Sequence[dict[str, Any]], block: str) -> list[dict[str, Any]]:
    """`block` joins the system message (a first one is made when there is none); an assistant's earlier
    calls become the JSON it would have answered, a tool's result a user message holding a `tool_response`
    (templates without tools know neither `tool_calls` nor the `tool` role)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            said = _text(message.get("content"))
            calls = "\n".join(_call_text(c) for c in message["tool_calls"])
            out.append({"role": "assistant", "content": (said + "\n" if said else "") + calls})
        elif role in ("tool", "function"):
            response = {"tool_call_id": message.get("tool_call_id"), "name": message.get("name"),
                        "content": _text(message.get("content"))}
            out.append({"role": "user", "content": orjson.dumps(
                {"tool_response": {k: v for k, v in response.items() if v is not None}}).decode()})
        else:
            out.append({k: v for k, v in message.items() if k not in ("tool_calls", "function_call")})
    if out and out[0].get("role") in ("system", "developer"):
        first = _text(out[0].get("content"))
        out[0] = {"role": "system", "content": (first + "\n\n" if first else "") + block}
    else:
        out.insert(0, {"role": "system", "content": block})
    return out


def answer_schema(tools: Sequence[dict[str, Any]], calls_only: bool = False) -> dict[str, Any]:
    """A call of one of the tools (the name one of theirs, the arguments that tool's schema), or a
    reply in words (left out when `calls_only`: `tool_choice: "required"`)."""
    branches: list[dict[str, Any]] = []
    for fn in _functions(tools):
        call = {"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": fn["parameters"]},
                "required": ["name", "arguments"], "additionalProperties": False}
        branches.append({"type": "object", "properties": {"tool_call": call}, "required": ["tool_call"],
                         "additionalProperties": False})
    if not calls_only:
        branches.append({"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"],
                         "additionalProperties": False})
    return branches[0] if len(branches) == 1 else {"anyOf": branches}
