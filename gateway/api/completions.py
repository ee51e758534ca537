from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.api.protocol import CompletionRequest
from gateway.api.serving import generate, parse_body, require, resolve_backend

router = APIRouter()


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    parsed, body = await parse_body(request, CompletionRequest)
    backend = resolve_backend(request, parsed.model, "completions")
    require(backend, n=parsed.n, logprobs=bool(body.get("logprobs") or body.get("top_logprobs")))
    return await generate(request, backend, "completions", body, parsed.include_usage)
