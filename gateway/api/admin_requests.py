"""The console's recent requests and limits (gateway/recent).

    GET /admin/requests?limit=&model=&tenant=&status=&id=   recent API requests, newest first
    GET /admin/requests/stream?model=&tenant=&status=       the same rows as SSE, each as it finishes
    GET /admin/limits                                       each key's limits and how close it is to them

Access (gateway/tenancy/access.py): /admin/requests* take any valid key; an admin key (or a gateway
without keys) sees every row, another key its own tenant's only (gateway/recent/query.py).
/admin/limits needs an admin key.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from fastapi import APIRouter, Query, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.api.admin_keys import _tenancy, _unavailable
from gateway.api.errors import APIError
from gateway.identity import Caller, caller_of
from gateway.recent import Filters, RecentRequests, Subscription, may_see, select
from gateway.recent.headroom import headroom
from gateway.recent.query import MAX_LIMIT, matches
from gateway.tenancy.store import StoreUnavailable

router = APIRouter()
HEARTBEAT_S = 15.0
LIVE_READERS_PER_TENANT = 8
"""Live streams one tenant (or, admins, one admin key's tenant) may hold open at once: each costs every request
a check, so the ninth is a 429 to its sender."""
STATUS_PATTERN = r"^([1-5][0-9][0-9]|[1-5]xx|error)$"


def _ring(request: Request) -> RecentRequests:
    return request.app.state.recent  # type: ignore[no-any-return]


@router.get("/admin/requests")
async def recent_requests(
    request: Request,
    limit: int = Query(100, ge=1, le=MAX_LIMIT),
    model: str | None = Query(None, max_length=256),
    tenant: str | None = Query(None, max_length=256),
    status: str | None = Query(None, pattern=STATUS_PATTERN),
    id: str | None = Query(None, max_length=128),
) -> dict[str, Any]:
    ring = _ring(request)
    filters = Filters(limit, model, tenant, status, id)
    rows = [f.row() for f in select(ring.newest_first(), caller_of(request.scope), filters)]
    return {"object": "list", "data": rows, "kept": ring.size,
            "trace_url": request.app.state.settings.trace_ui_url}


class LiveRows(Response):
    """SSE: `data: <row>` for every new row the caller may see and the filters match; a comment every
    HEARTBEAT_S; ends when the client leaves, when the gateway shuts down (an `event: end`), or when
    the reader fell SUBSCRIBER_BACKLOG rows behind (`event: end` with `data: {"reason": "lagged"}`)."""

    media_type = "text/event-stream"

    def __init__(self, ring: RecentRequests, caller: Caller | None, filters: Filters) -> None:
        self.ring = ring
        self.caller = caller
        self.filters = filters
        self.status_code = 200
        self.background = None
        self.raw_headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                            (b"x-accel-buffering", b"no")]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        caller, filters = self.caller, self.filters
        sub = self.ring.subscribe(lambda f: may_see(caller, f) and matches(filters, f),
                                  None if caller is None else caller.name)
        listener = asyncio.ensure_future(_until_disconnect(receive, sub))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            await send({"type": "http.response.body", "body": b": live\n\n", "more_body": True})
            while (batch := await sub.next(HEARTBEAT_S)) is not None:  # only rows it accepts: [] is the heartbeat
                chunk = b"".join(b"data: " + orjson.dumps(f.row()) + b"\n\n" for f in batch)
                await send({"type": "http.response.body", "body": chunk or b": ping\n\n", "more_body": True})
            if not listener.done():  # the gateway is shutting down, or this reader fell behind
                reason = b"lagged" if sub.lagged else b"shutdown"
                await send({"type": "http.response.body", "body": b'event: end\ndata: {"reason": "' + reason + b'"}\n\n',
                            "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            listener.cancel()
            self.ring.unsubscribe(sub)


async def _until_disconnect(receive: Receive, sub: Subscription) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    sub.end()


@router.get("/admin/requests/stream", include_in_schema=False)  # endless: no schema-driven client can call it through
async def recent_requests_stream(
    request: Request,
    model: str | None = Query(None, max_length=256),
    tenant: str | None = Query(None, max_length=256),
    status: str | None = Query(None, pattern=STATUS_PATTERN),
) -> Response:
    ring, caller = _ring(request), caller_of(request.scope)
    if ring.subscribers_of(None if caller is None else caller.name) >= LIVE_READERS_PER_TENANT:
        raise APIError(429, f"at most {LIVE_READERS_PER_TENANT} live request streams per key's tenant are open at "
                            "once; close one first", code="too_many_streams", headers={"Retry-After": "5"})
    return LiveRows(ring, caller, Filters(MAX_LIMIT, model, tenant, status))


@router.get("/admin/limits")
async def limits(request: Request) -> dict[str, Any]:
    t = _tenancy(request)
    try:
        stored = await t.store.list()
    except StoreUnavailable as exc:
        raise _unavailable(exc) from exc
    seen = _ring(request).limits
    now = time.time()
    rows = [headroom(r.name, r.policy, seen.get(r.name), now)
            for r in [*t.static_names.values(), *stored] if r.revoked_at is None]
    return {"object": "list", "data": rows,
            "note": "used: as the tenant's last request through this gateway found its counters"}


