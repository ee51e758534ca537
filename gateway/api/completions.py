from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.api.fanout import n_choices
from gateway.api.protocol import CompletionRequest, engine_body
from gateway.api.refusals import refuse
from gateway.api.serving import generate, parse_body, require, resolve_backend
from gateway.api.validate import check_token_ids

router = APIRouter()


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    parsed, body = await parse_body(request, CompletionRequest, refuse("completions"))
    backend = resolve_backend(request, parsed.model, "completions")
    check_token_ids(parsed.prompt, "prompt", backend.adapter.describe())
    require(backend, body)
    n = parsed.n or 1
    fan_out = (lambda adapter: n_choices(adapter.completions, n)) if n > 1 and not backend.adapter.capabilities.n_choices else None
    return await generate(request, backend, "completions", engine_body(parsed), parsed.include_usage, call=fan_out)
