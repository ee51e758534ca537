"""docs/reference/refusals.md from gateway/api/refusals.py."""

from __future__ import annotations

from gateway.api.refusals import REFUSALS
from gateway.docgen.markdown import cell, table

APIS = {"chat": "`/v1/chat/completions`", "completions": "`/v1/completions`", "responses": "`/v1/responses`",
        "messages": "`/v1/messages` (and `count_tokens`)"}


def render() -> str:
    rows = [[APIS[r.api], f"`{r.field}`", cell(r.when), f"`{r.code}`"] for r in REFUSALS]
    return "\n".join([
        "# Refused fields",
        "",
        "Fields of the OpenAI and Anthropic APIs the gateway does not implement are refused with a 400, never",
        "accepted and ignored: a client that asked for a background run, extended thinking or a server tool",
        "learns that it did not get one. The table is `REFUSALS` in `gateway/api/refusals.py`. `param` names",
        "the field (on `/v1/messages`, whose errors carry no `param`, the message names it). The code is",
        "`unsupported_parameter` where the API defines the field and the gateway does not do it,",
        "`invalid_value` where the request contradicts itself.",
        "",
        table(["API", "field", "refused when", "code"], rows),
        "",
        "Checked with the tools and schemas, with the same codes (`gateway/api/tool_checks.py`):",
        "`tool_choice: \"required\"` (or Anthropic's `any`) without tools, a named `tool_choice` that is not",
        "in `tools` (`invalid_value`, `param` `tool_choice...`), a tool whose type is not `function`",
        "(`{\"type\": \"custom\"}`: `invalid_value`, `param` `tools[i].type`, streamed or not: the 400 comes",
        "before any stream), a function's `parameters` or a `response_format` schema that is not a JSON Schema",
        "(`invalid_function_parameters`, `invalid_json_schema`). The conformance suite runs every row with the",
        "official `openai` and `anthropic` clients (`tests/conformance/test_refusals.py`).",
    ])
