from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.api.protocol import EmbeddingRequest, engine_body
from gateway.api.serving import generate, parse_body, resolve_backend
from gateway.api.validate import check_token_ids

router = APIRouter()


@router.post("/v1/embeddings")
async def embeddings(request: Request) -> Response:
    parsed, _ = await parse_body(request, EmbeddingRequest)
    backend = resolve_backend(request, parsed.model, "embeddings")
    check_token_ids(parsed.input, "input", backend.adapter.describe())
    return await generate(request, backend, "embeddings", engine_body(parsed), include_usage=False)
