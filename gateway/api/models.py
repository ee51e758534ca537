from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from gateway.api.serving import model_not_found, runtime
from gateway.tenancy.middleware import may_use
from gateway.routing import Backend

router = APIRouter()


def model_card(backend: Backend) -> dict[str, Any]:
    return {
        "id": backend.model_id,
        "object": "model",
        "created": backend.created,
        "owned_by": "enginegate",
        "engine": backend.engine,
        "aliases": list(backend.aliases),
        "meta": backend.adapter.describe(),
        **({"status": _status(backend)} if backend.lifecycle is not None else {}),
    }


def _status(backend: Backend) -> dict[str, Any]:
    """The model's lifecycle: state (loaded, loading, unloaded, unloading, failed with reason), footprint, pin."""
    assert backend.lifecycle is not None
    view = backend.lifecycle.view()
    return {k: view[k] for k in ("state", "reason", "engine", "engine_reason", "pinned", "preload", "ttl_seconds", "footprint",
                                 "load_seconds", "fallbacks") if k in view}


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": [model_card(b) for b in runtime(request).models
                                       if may_use(request.scope, b.model_id, b.aliases)]}


@router.get("/v1/models/{model_id:path}")
async def get_model(request: Request, model_id: str) -> dict[str, Any]:
    backend = runtime(request).models.get(model_id)
    if backend is None or not may_use(request.scope, backend.model_id, backend.aliases):
        raise model_not_found(request, model_id)
    return model_card(backend)
