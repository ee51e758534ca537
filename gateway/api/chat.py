from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.api.errors import APIError
from gateway.api.fanout import n_choices
from gateway.api.modalities import check_modalities
from gateway.api.protocol import ChatCompletionRequest, ResponseFormat, engine_body
from gateway.api.tool_checks import check_response_schema, check_tool_choice, check_tools, renamer
from gateway.api.refusals import refuse
from gateway.api.serving import generate, parse_body, require, resolve_backend
from gateway.routing import Backend

router = APIRouter()


def check_chat(
    backend: Backend,
    *,
    tools: list[dict[str, Any]] | None,
    response_format: ResponseFormat | None,
    names: dict[str, str] | None = None,
    tool_choice: Any = None,
) -> None:
    """What the engine cannot do, and tools or schemas it could not read, answer 400 before any work;
    `names` renames params for translated APIs (see `renamer`)."""
    names = names or {}
    caps = backend.adapter.capabilities
    if tools and not caps.tools:
        raise APIError(400, f"tools are not supported by the {backend.engine} engine", param=names.get("tools", "tools"))
    param = renamer(names)
    check_tool_choice(tool_choice, check_tools(tools, param), param)
    fmt_param = names.get("response_format", "response_format")
    if response_format and response_format.type != "text" and not caps.structured_output:
        raise APIError(400, f"{fmt_param} is not supported by the {backend.engine} engine", param=fmt_param)
    if response_format and response_format.type == "json_schema":
        # chat's `response_format.json_schema.{name,schema}`; a translated API's format holds them itself
        check_response_schema(response_format.json_schema, fmt_param if "response_format" in names else f"{fmt_param}.json_schema")


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    parsed, body = await parse_body(request, ChatCompletionRequest, refuse("chat"))
    backend = resolve_backend(request, parsed.model, "chat")
    check_chat(backend, tools=parsed.tools, response_format=parsed.response_format, tool_choice=parsed.tool_choice)
    check_modalities(backend, body["messages"], lambda i: f"messages.{i}.content")
    require(backend, body)
    n = parsed.n or 1
    fan_out = (lambda adapter: n_choices(adapter.chat, n)) if n > 1 and not backend.adapter.capabilities.n_choices else None
    return await generate(request, backend, "chat", engine_body(parsed), parsed.include_usage, call=fan_out)
