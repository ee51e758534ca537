from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.api.errors import APIError
from gateway.api.protocol import ChatCompletionRequest, engine_body
from gateway.api.serving import generate, parse_body, resolve_backend

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    parsed = await parse_body(request, ChatCompletionRequest)
    backend = resolve_backend(request, parsed.model, "chat")
    caps = backend.adapter.capabilities
    if (parsed.n or 1) > 1 and not caps.n_choices:
        raise APIError(400, f"n > 1 is not supported by the {backend.engine} engine; send n separate requests", param="n")
    if parsed.tools and not caps.tools:
        raise APIError(400, f"tools are not supported by the {backend.engine} engine", param="tools")
    if parsed.response_format and parsed.response_format.type != "text" and not caps.structured_output:
        raise APIError(400, f"response_format is not supported by the {backend.engine} engine", param="response_format")
    if parsed.response_format and parsed.response_format.type == "json_schema":
        schema = (parsed.response_format.json_schema or {}).get("schema")
        if not isinstance(schema, dict):
            raise APIError(400, "response_format.json_schema.schema must be a JSON schema object", param="response_format")
    return await generate(request, backend, "chat", engine_body(parsed), parsed.include_usage)
