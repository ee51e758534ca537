from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from gateway.api.serving import metrics, runtime

router = APIRouter()
STATS_TIMEOUT_S = 2.0


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


@router.get("/metrics")
async def prometheus_metrics(request: Request) -> Response:
    m = metrics(request)
    for backend in runtime(request).models:
        m.queue_waiting.labels(backend.model_id).set(backend.admission.waiting)
        m.running.labels(backend.model_id).set(backend.admission.running)
        health_ = await backend.adapter.health()
        m.model_ready.labels(backend.model_id, backend.engine).set(1 if health_.ready else 0)
        try:
            stats = await asyncio.wait_for(backend.adapter.engine_stats(), STATS_TIMEOUT_S)
        except (TimeoutError, Exception):
            stats = None
        if stats is not None:
            m.set_engine_stats(backend.model_id, backend.engine, stats)
    return Response(m.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


@router.get("/v1/gateway/plan")
async def plans(request: Request) -> dict[str, Any]:
    rt = runtime(request)
    snapshot = rt.snapshot.model_dump(mode="json") if rt.snapshot is not None else None
    return {
        "hardware": snapshot,
        "plans": {mid: (p.model_dump(mode="json") if hasattr(p, "model_dump") else p) for mid, p in rt.plans.items()},
    }
