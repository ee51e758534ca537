from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.api.fanout import n_choices
from gateway.api.protocol import CompletionRequest
from gateway.api.serving import generate, parse_body, resolve_backend

router = APIRouter()


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    parsed, body = await parse_body(request, CompletionRequest)
    backend = resolve_backend(request, parsed.model, "completions")
    n = parsed.n or 1
    fan_out = n_choices(backend.adapter.completions, n) if n > 1 and not backend.adapter.capabilities.n_choices else None
    return await generate(request, backend, "completions", body, parsed.include_usage, call=fan_out)
