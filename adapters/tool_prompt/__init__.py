"""Tools for chat templates that do not render them: the tool definitions written into the prompt in one
documented form (llama.cpp's generic tool-call format: the answer is JSON, `{"tool_call": {"name", "arguments"}}`
or `{"response": "..."}`), the answer constrained to that form by a JSON schema where the engine takes one,
and the call parsed back out (docs/tools.md). Pure functions; the engines' adapters do the I/O."""

from adapters.tool_prompt.answer import AnswerStream, Parsed, parse_answer
from adapters.tool_prompt.detect import PROBE_MESSAGES, PROBE_TOOLS, renders_tools
from adapters.tool_prompt.render import answer_schema, args_instruction, render_messages, tools_block
from adapters.tool_prompt.rewrite import as_answer, as_answer_stream

__all__ = [
    "PROBE_MESSAGES",
    "PROBE_TOOLS",
    "AnswerStream",
    "Parsed",
    "answer_schema",
    "args_instruction",
    "as_answer",
    "as_answer_stream",
    "parse_answer",
    "render_messages",
    "renders_tools",
    "tools_block",
]
