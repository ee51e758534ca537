"""Admin view of engine servers: state, restarts and the engine's own log lines.

    GET /admin/engines                      every model's engine state (describe())
    GET /admin/engines/{model}/logs?lines=N the last N lines of that engine's stdout/stderr
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request

from adapters.server import ServerAdapter
from gateway.api.errors import APIError
from gateway.api.serving import model_not_found, runtime

router = APIRouter()
MAX_LINES = 5000


@router.get("/admin/engines")
async def engines(request: Request) -> dict[str, Any]:
    return {b.model_id: {"engine": b.engine, **b.adapter.describe()} for b in runtime(request).models}


@router.get("/admin/engines/{model}/logs")
async def engine_logs(request: Request, model: str, lines: int = Query(200, ge=1, le=MAX_LINES)) -> dict[str, Any]:
    backend = runtime(request).models.get(model)
    if backend is None:
        raise model_not_found(request, model)
    if not isinstance(backend.adapter, ServerAdapter):
        raise APIError(400, f"engine {backend.engine} runs in-process and keeps no engine log", code="no_engine_log")
    return {"model": backend.model_id, "engine": backend.engine, "lines": backend.adapter.logs(lines),
            "log_path": backend.adapter.describe().get("log_path")}
