from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from gateway.api.serving import runtime

router = APIRouter()


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/ready")
async def ready(request: Request) -> Response:
    rt = runtime(request)
    models: dict[str, Any] = {}
    for backend in rt.models:
        h = await backend.adapter.health()
        models[backend.model_id] = {"engine": backend.engine, "ready": h.ready, "detail": h.detail}
    all_ready = rt.started and bool(models) and all(m["ready"] for m in models.values())
    return JSONResponse({"status": "ready" if all_ready else "not_ready", "models": models}, status_code=200 if all_ready else 503)


@router.get("/v1/gateway/plan")
async def plans(request: Request) -> dict[str, Any]:
    rt = runtime(request)
    snapshot = rt.snapshot.model_dump(mode="json") if rt.snapshot is not None else None
    return {
        "hardware": snapshot,
        "plans": {mid: p.model_dump(mode="json") for mid, p in rt.plans.items()},
    }
