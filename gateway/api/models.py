from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from gateway.api.errors import APIError
from gateway.api.serving import runtime
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
    }


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": [model_card(b) for b in runtime(request).models]}


@router.get("/v1/models/{model_id:path}")
async def get_model(request: Request, model_id: str) -> dict[str, Any]:
    backend = runtime(request).models.get(model_id)
    if backend is None:
        raise APIError(404, f"The model `{model_id}` does not exist", param="model", code="model_not_found")
    return model_card(backend)
