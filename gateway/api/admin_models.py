"""Admin: load and unload models by hand.

    GET  /admin/models                  every model's lifecycle (state, footprint, fallbacks)
    POST /admin/models/{id}/load        load it now (evicting idle models if the budget needs); waits for the load
    POST /admin/models/{id}/unload      stop admitting requests to it, let running ones finish, unload it
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from gateway.api.errors import APIError
from gateway.api.serving import model_not_found, runtime
from gateway.routing import ModelLifecycle, ModelUnavailable

router = APIRouter()


def _lifecycle(request: Request, model: str) -> ModelLifecycle:
    backend = runtime(request).models.get(model)
    if backend is None:
        raise model_not_found(request, model)
    assert backend.lifecycle is not None
    return backend.lifecycle


@router.get("/admin/models")
async def list_models(request: Request) -> dict[str, Any]:
    return {lc.name: lc.view() for lc in runtime(request).lifecycles}


@router.post("/admin/models/{model:path}/load")
async def load(request: Request, model: str) -> dict[str, Any]:
    return await _act(request, model, "load")


@router.post("/admin/models/{model:path}/unload")
async def unload(request: Request, model: str) -> dict[str, Any]:
    return await _act(request, model, "unload")


async def _act(request: Request, model: str, action: str) -> dict[str, Any]:
    lc = _lifecycle(request, model)
    lifecycles = runtime(request).lifecycles
    try:
        await (lifecycles.load(lc) if action == "load" else lifecycles.unload(lc))
    except ModelUnavailable as exc:
        raise APIError(503, exc.reason, code=exc.code, headers={"Retry-After": str(exc.retry_after)}) from exc
    return {"model": lc.name, **lc.view()}
