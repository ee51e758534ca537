from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.api.errors import APIError
from gateway.api.protocol import ChatCompletionRequest
from gateway.api.serving import generate, parse_body, require, resolve_backend

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    parsed, body = await parse_body(request, ChatCompletionRequest)
    backend = resolve_backend(request, parsed.model, "chat")
    require(backend, n=parsed.n, tools=bool(parsed.tools), logprobs=bool(body.get("logprobs") or body.get("top_logprobs")),
            response_format=parsed.response_format.type if parsed.response_format else None)
    if parsed.response_format and parsed.response_format.type == "json_schema":
        schema = (parsed.response_format.json_schema or {}).get("schema")
        if not isinstance(schema, dict):
            raise APIError(400, "response_format.json_schema.schema must be a JSON schema object", param="response_format")
    return await generate(request, backend, "chat", body, parsed.include_usage)
