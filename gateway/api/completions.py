from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.api.errors import APIError
from gateway.api.protocol import CompletionRequest
from gateway.api.serving import generate, parse_body, resolve_backend

router = APIRouter()


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    parsed, body = await parse_body(request, CompletionRequest)
    backend = resolve_backend(request, parsed.model, "completions")
    if (parsed.n or 1) > 1 and not backend.adapter.capabilities.n_choices:
        raise APIError(400, f"n > 1 is not supported by the {backend.engine} engine; send n separate requests", param="n")
    return await generate(request, backend, "completions", body, parsed.include_usage)
