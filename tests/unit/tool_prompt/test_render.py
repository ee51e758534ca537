"""The tools written into the prompt, the history made renderable, and the answer's schema."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from jsonschema import Draft202012Validator

from adapters.tool_prompt import answer_schema, args_instruction, render_messages, renders_tools, tools_block

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time"}}]


def test_block_lists_every_tool_and_the_form() -> None:
    block = tools_block(TOOLS)
    assert '{"name":"get_weather","description":"Current weather","parameters":' in block
    assert '{"name":"get_time","parameters":{"type":"object","properties":{}}}' in block
    assert '{"tool_call": {"name"' in block and '{"response"' in block
    assert "get_weather" in args_instruction(TOOLS, "get_weather") and "get_time" not in args_instruction(TOOLS, "get_weather")


@pytest.mark.parametrize(("messages", "expected"), [
    ([{"role": "user", "content": "hi"}], [{"role": "system", "content": "B"}, {"role": "user", "content": "hi"}]),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
     [{"role": "system", "content": "Be brief.\n\nB"}, {"role": "user", "content": "hi"}]),
    ([{"role": "developer", "content": [{"type": "text", "text": "Dev."}]}, {"role": "user", "content": "hi"}],
     [{"role": "system", "content": "Dev.\n\nB"}, {"role": "user", "content": "hi"}]),
    ([{"role": "user", "content": "weather?"},
      {"role": "assistant", "content": None, "tool_calls": [
          {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
     [{"role": "system", "content": "B"}, {"role": "user", "content": "weather?"},
      {"role": "assistant", "content": '{"tool_call":{"name":"get_weather","arguments":{"city":"Paris"}}}'},
      {"role": "user", "content": '{"tool_response":{"tool_call_id":"c1","content":"sunny"}}'}]),
])
def test_render_messages(messages: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    assert render_messages(messages, "B") == expected


CALL = {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}


@pytest.mark.parametrize(("answer", "calls_only", "valid"), [
    (CALL, False, True),
    ({"response": "It is sunny."}, False, True),
    ({"response": "It is sunny."}, True, False),
    ({"tool_call": {"name": "get_weather", "arguments": {}}}, False, False),  # the tool's own schema holds
    ({"tool_call": {"name": "get_time", "arguments": {}}}, False, True),
    ({"tool_call": {"name": "launch", "arguments": {}}}, False, False),  # no such tool
    ({"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}, "response": "x"}, False, False),
])
def test_answer_schema(answer: dict[str, Any], calls_only: bool, valid: bool) -> None:
    schema = answer_schema(TOOLS, calls_only=calls_only)
    Draft202012Validator.check_schema(schema)
    assert Draft202012Validator(schema).is_valid(answer) is valid
    assert orjson.loads(orjson.dumps(schema)) == schema


@pytest.mark.parametrize(("without", "with_tools", "renders"), [
    ("<user>hi", "<user>hi", False),  # SmolLM2: role and content only
    ("<user>hi", "<tools>[...]</tools><user>hi", True),
    (37, 37, False),
    (37, 120, True),
    ("<user>hi", None, False),  # the template raised on tools
    (None, None, False),
])
def test_renders_tools(without: str | int | None, with_tools: str | int | None, renders: bool) -> None:
    assert renders_tools(without, with_tools) is renders
