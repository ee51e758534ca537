"""Does a chat template render `tools`? The engine renders one probe conversation with and without one probe
tool, with its own template engine (llama-cpp-python's chat handler, llama-server's /apply-template); a
template that ignores tools renders the same prompt (SmolLM2's writes only each message's role and content)."""

from __future__ import annotations

from typing import Any

PROBE_MESSAGES: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Paris?"}]
PROBE_TOOLS: list[dict[str, Any]] = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def renders_tools(without_tools: str | int | None, with_tools: str | int | None) -> bool:
    """The two renderings (prompt texts, or their token counts) -> whether the tool reached the prompt.

    A rendering that failed (None: the template raised on tools) counts as not rendering them."""
    if without_tools is None or with_tools is None:
        return False
    return with_tools != without_tools
