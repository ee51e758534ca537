from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.api.protocol import EmbeddingRequest
from gateway.api.serving import generate, parse_body, resolve_backend

router = APIRouter()


@router.post("/v1/embeddings")
async def embeddings(request: Request) -> Response:
    parsed, body = await parse_body(request, EmbeddingRequest)
    backend = resolve_backend(request, parsed.model, "embeddings")
    return await generate(request, backend, "embeddings", body, include_usage=False)
