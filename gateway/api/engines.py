"""Admin view of engine servers: state, restarts and the engine's own log lines.

    GET /admin/engines                      every model's engine state (describe())
    GET /admin/engines/{model}/logs?lines=N&replica=I  the last N lines of that engine's (replica's) stdout/stderr
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
    found: dict[str, Any] = {}
    for b in runtime(request).models:
        found[b.model_id] = {"engine": b.engine, **b.adapter.describe()}
        if len(b.replicas) > 1:  # the top level is the first replica's, as before
            found[b.model_id]["replicas"] = [{"name": r.name, "engine": r.adapter.engine, **r.adapter.describe()}
                                             for r in b.replicas]
    return found


@router.get("/admin/engines/{model}/logs")
async def engine_logs(request: Request, model: str, lines: int = Query(200, ge=1, le=MAX_LINES),
                      replica: int = Query(0, ge=0)) -> dict[str, Any]:
    backend = runtime(request).models.get(model)
    if backend is None:
        raise model_not_found(request, model)
    if replica >= len(backend.replicas):
        raise APIError(404, f"model {backend.model_id} has {len(backend.replicas)} replica(s) (0..{len(backend.replicas) - 1})",
                       param="replica", code="not_found")
    adapter = backend.replicas[replica].adapter
    if not isinstance(adapter, ServerAdapter):
        raise APIError(400, f"engine {adapter.engine} runs in-process and keeps no engine log", code="no_engine_log")
    return {"model": backend.model_id, "engine": adapter.engine, "replica": replica, "lines": adapter.logs(lines),
            "log_path": adapter.describe().get("log_path")}
