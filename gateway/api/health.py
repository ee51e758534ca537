from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from gateway.api.redact import hide_internals
from gateway.api.serving import runtime
from gateway.identity import caller_of

router = APIRouter()


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/ready")
async def ready(request: Request) -> Response:
    rt = runtime(request)
    caller = caller_of(request.scope)
    operator = caller is not None and caller.is_admin
    models: dict[str, Any] = {}
    for backend in rt.models:
        h = await backend.health()
        detail = h.detail if operator else hide_internals(h.detail)  # the operator's: an admin key, or /admin/engines
        state = backend.lifecycle.state.value if backend.lifecycle is not None else None
        models[backend.model_id] = {"engine": backend.engine, "ready": h.ready, "state": state, "detail": detail}
    if request.app.state.drain.draining:
        return JSONResponse({"status": "draining", "models": models}, status_code=503)
    # Ready while some model can serve: loaded and ready, or unloaded (it loads on demand). A model
    # that failed, or a loaded one whose engine is down, does not keep the others from serving.
    all_ready = rt.started and any(m["ready"] or m["state"] == "unloaded" for m in models.values())
    return JSONResponse({"status": "ready" if all_ready else "not_ready", "models": models}, status_code=200 if all_ready else 503)


@router.get("/v1/gateway/plan")
async def plans(request: Request) -> dict[str, Any]:
    rt = runtime(request)
    snapshot = rt.snapshot.model_dump(mode="json") if rt.snapshot is not None else None
    return {
        "hardware": snapshot,
        "plans": {mid: p.model_dump(mode="json") for mid, p in rt.plans.items()},
        "models": {lc.name: lc.view() for lc in rt.lifecycles},
        "memory_budget": rt.lifecycles.capacity,
    }
