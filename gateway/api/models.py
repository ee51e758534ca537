from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from gateway.api.redact import hide_in
from gateway.api.serving import model_not_found, runtime
from gateway.identity import caller_of
from gateway.tenancy.middleware import may_use
from gateway.routing import Backend

router = APIRouter()
TENANT_META = ("engine", "state", "context_length", "trained_context_length", "embedding_length", "vocab_size",
               "threads", "restarts", "embedder")
"""What a user key sees of an engine's `describe()`: the model's facts, never the host's (file paths, process ids,
ports, URLs, log files, images); a new field stays the operator's until it is listed here."""


def model_card(backend: Backend, operator: bool = True) -> dict[str, Any]:
    """The /v1/models entry; `operator` False (a user key) hides the host's paths, processes and URLs."""
    card = {
        "id": backend.model_id,
        "object": "model",
        "created": backend.created,
        "owned_by": "enginegate",
        "engine": backend.engine,
        "aliases": list(backend.aliases),
        "meta": backend.adapter.describe(),
        **({"status": _status(backend)} if backend.lifecycle is not None else {}),
    }
    if backend.parent is not None:  # a LoRA adapter, named as vLLM lists them: its base is `parent`
        card["parent"] = backend.parent
        card["root"] = backend.info.get("path") if operator else backend.model_id
    if operator:
        return card
    card["meta"] = hide_in({k: v for k, v in card["meta"].items() if k in TENANT_META})
    if "status" in card:  # a failed load's reason may name the file or the engine's URL
        card["status"] = hide_in(card["status"])
    return card


def _operator(request: Request) -> bool:
    """An admin key, or a gateway without keys (whose every route, /admin/engines included, is open)."""
    caller = caller_of(request.scope)
    return caller is None or caller.is_admin


def _status(backend: Backend) -> dict[str, Any]:
    """The model's lifecycle: state (loaded, loading, unloaded, unloading, failed with reason), footprint, pin,
    and whether an admin unload waits for running requests (nothing new is admitted meanwhile)."""
    assert backend.lifecycle is not None
    view = backend.lifecycle.view()
    return {k: view[k] for k in ("state", "reason", "engine", "engine_reason", "pinned", "preload", "ttl_seconds", "footprint",
                                 "load_seconds", "unload_asked", "fallbacks") if k in view}


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    operator = _operator(request)
    return {"object": "list", "data": [model_card(b, operator) for b in runtime(request).models.served()
                                       if may_use(request.scope, b.model_id, b.aliases)]}


@router.get("/v1/models/{model_id:path}")
async def get_model(request: Request, model_id: str) -> dict[str, Any]:
    backend = runtime(request).models.get(model_id)
    if backend is None or not may_use(request.scope, backend.model_id, backend.aliases):
        raise model_not_found(request, model_id)
    return model_card(backend, _operator(request))
