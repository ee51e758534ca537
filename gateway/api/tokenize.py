"""vLLM's tokenizer routes, per model, with the engine's own tokenizer: POST /tokenize, POST /detokenize,
GET /tokenizer_info (at the root, where vLLM serves them and lm-eval's remote tokenizer calls them).

`model` may be left out (lm-eval's remote tokenizer sends none) when the caller may use exactly one model.
A model the caller's key may not use is the same 404 as on the generation routes."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field, StrictInt
from starlette.responses import JSONResponse, Response

from adapters.base import Completion, RequestContext
from gateway.api.errors import APIError
from gateway.api.protocol import ChatMessage, _Permissive
from gateway.api.serving import admit, parse_body, resolve_backend, runtime
from gateway.metrics import request_id
from gateway.routing.registry import Backend
from gateway.tenancy import middleware as tenancy

router = APIRouter()


class TokenizeRequest(_Permissive):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None
    return_token_strs: bool | None = None


class DetokenizeRequest(_Permissive):
    model: str | None = None
    tokens: list[StrictInt]


def _backend(request: Request, model: str | None) -> Backend:
    if model:
        return resolve_backend(request, model, "completions")
    usable = [b for b in runtime(request).models if tenancy.may_use(request.scope, b.model_id, b.aliases)]
    if len(usable) != 1:
        raise APIError(400, "model is required: name the model whose tokenizer to use"
                       + (f" (served here: {', '.join(b.model_id for b in usable[:20])})" if usable else ""), param="model")
    return resolve_backend(request, usable[0].model_id, "completions")


async def _run(request: Request, backend: Backend, op: str, body: dict[str, Any]) -> Response:
    """On one of the model's replicas, once it is loaded (an engine slot held for the call: the
    in-process engine's tokenizer is the loaded model's)."""
    lease = await admit(request, backend)
    ctx = RequestContext(request_id=request_id(request.scope), model=backend.model_id)
    try:
        adapter = lease.adapter
        result: Completion = await (adapter.tokenizer_info(ctx) if op == "tokenizer_info"
                                    else getattr(adapter, op)(body, ctx))
    finally:
        lease.release()
    if isinstance(result.body, bytes):
        return Response(result.body, status_code=result.status, media_type="application/json")
    return JSONResponse(result.body, status_code=result.status)


@router.post("/tokenize")
async def tokenize(request: Request) -> Response:
    parsed, body = await parse_body(request, TokenizeRequest)
    if (parsed.prompt is None) == (parsed.messages is None):
        raise APIError(400, "send either prompt (a string) or messages", param="prompt")
    backend = _backend(request, parsed.model)
    return await _run(request, backend, "tokenize", body)


@router.post("/detokenize")
async def detokenize(request: Request) -> Response:
    parsed, body = await parse_body(request, DetokenizeRequest)
    if any(t < 0 for t in parsed.tokens):
        raise APIError(400, "tokens: token ids must be >= 0", param="tokens")
    backend = _backend(request, parsed.model)
    return await _run(request, backend, "detokenize", body)


@router.get("/tokenizer_info")
async def tokenizer_info(request: Request, model: str | None = None) -> Response:
    backend = _backend(request, model)
    return await _run(request, backend, "tokenizer_info", {})
