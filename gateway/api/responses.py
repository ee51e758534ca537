"""POST /v1/responses (OpenAI Responses, translated to chat on every engine) and its stored state:
GET and DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

import orjson
from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from gateway.api.chat import check_chat
from gateway.api.errors import APIError
from gateway.api.modalities import check_modalities
from gateway.api.protocol import ResponseFormat
from gateway.api.response_store import ANONYMOUS, ResponseStore, StoredResponse, StoreUnavailable, default_store_path
from gateway.api.responses_translate import (
    NativeResponsesDialect,
    ResponsesDialect,
    ResponseShell,
    ResponsesRequest,
    input_items,
    native_body,
    to_chat,
)
from gateway.api.refusals import refuse
from gateway.api.serving import echoed, generate, parse_body, resolve_backend
from gateway.api.sqlite_response_store import SQLiteResponseStore
from gateway.config import Settings
from gateway.identity import caller_of

if TYPE_CHECKING:  # asyncpg is an extra: imported only when database_url is set
    from gateway.database import Database

log = logging.getLogger("enginegate.responses")
router = APIRouter()
NAMES = {"tools": "tools", "response_format": "text.format", "tools.function": "", "tools.parameters": "parameters"}
"""Responses' flat tools (`tools[0].name`, `tools[0].parameters`) for the chat params the checks name."""


def build_store(settings: Settings, database: Database | None = None) -> ResponseStore:
    """The shared database's store when `database_url` is set (its pool is `database`), else the SQLite file."""
    cfg = settings.response_store
    if database is not None:
        from gateway.api.postgres_response_store import PostgresResponseStore

        return PostgresResponseStore(database, cfg.max_age_seconds, cfg.max_count)
    return SQLiteResponseStore(cfg.path or default_store_path(), cfg.max_age_seconds, cfg.max_count,
                               own_folder=cfg.path is None)


def _store(request: Request) -> ResponseStore:
    return request.app.state.response_store  # type: ignore[no-any-return]


def owner_of(request: Request) -> str:
    """The tenant a stored response belongs to: the caller's key name (ANONYMOUS without keys)."""
    caller = caller_of(request.scope)
    return caller.name if caller is not None else ANONYMOUS


def reach_of(request: Request) -> str | None:
    """Whose records this caller may read or delete: its own; None (every owner) for an admin or without keys."""
    caller = caller_of(request.scope)
    return None if caller is None or caller.is_admin else caller.name


@contextlib.contextmanager
def _usable_store(request: Request) -> Iterator[None]:
    """A store that cannot be used (its disk gone, its database down) answers 503 with Retry-After, never 500."""
    try:
        yield
    except StoreUnavailable as exc:
        retry_after = request.app.state.settings.retry_after_seconds
        raise APIError(503, str(exc), code="store_unavailable", headers={"Retry-After": str(retry_after)}) from exc


def _not_found(response_id: str) -> APIError:
    return APIError(404, f"Response with id '{echoed(response_id)}' not found.", param="response_id", code="not_found")


@router.post("/v1/responses")
async def create_response(request: Request) -> Response:
    parsed, raw = await parse_body(request, ResponsesRequest, refuse("responses"))
    store = _store(request)
    history: list[dict[str, Any]] = []
    if parsed.previous_response_id is not None:
        with _usable_store(request):
            previous = await store.get(parsed.previous_response_id, reach_of(request))
        if previous is None:
            raise APIError(400, f"Previous response with id '{echoed(parsed.previous_response_id)}' not found.",
                           param="previous_response_id", code="previous_response_not_found")
        history = previous.history
    items = input_items(parsed)
    backend = resolve_backend(request, parsed.model, "chat")

    async def on_done(response: dict[str, Any]) -> None:
        if not parsed.store:
            return
        output = response.get("output") or []
        record = StoredResponse(str(response["id"]), owner_of(request), time.time(), response, items, history + items + output)
        try:
            await store.put(record)
        except Exception:  # the answer is still good; say it was not stored rather than fail it
            log.exception("could not store response %s", response["id"])
            response["store"] = False

    if backend.adapter.capabilities.responses:  # the engine's own Responses API; the state stays here
        native = native_body(raw, history + items)
        return await generate(request, backend, "responses", native, True, NativeResponsesDialect(parsed, on_done))
    body = to_chat(parsed, history + items)
    fmt = body.get("response_format")
    check_chat(backend, tools=body.get("tools"), response_format=ResponseFormat.model_validate(fmt) if fmt else None,
               names=NAMES, tool_choice=body.get("tool_choice"))
    check_modalities(backend, body["messages"], lambda _: "input")
    return await generate(request, backend, "chat", body, True, ResponsesDialect(ResponseShell(parsed), on_done))


@router.get("/v1/responses/{response_id}")
async def get_response(request: Request, response_id: str) -> Response:
    with _usable_store(request):
        record = await _store(request).get(response_id, reach_of(request))
    if record is None:
        raise _not_found(response_id)
    return Response(orjson.dumps(record.response), media_type="application/json")


@router.delete("/v1/responses/{response_id}")
async def delete_response(request: Request, response_id: str) -> dict[str, Any]:
    with _usable_store(request):
        deleted = await _store(request).delete(response_id, reach_of(request))
    if not deleted:
        raise _not_found(response_id)
    return {"id": response_id, "object": "response", "deleted": True}


@router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(
    request: Request,
    response_id: str,
    limit: int = Query(default=20, ge=1, le=100),
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
) -> dict[str, Any]:
    with _usable_store(request):
        record = await _store(request).get(response_id, reach_of(request))
    if record is None:
        raise _not_found(response_id)
    items = record.input_items if order == "asc" else list(reversed(record.input_items))
    if after is not None:
        ids = [item.get("id") for item in items]
        if after not in ids:
            raise APIError(400, f"no input item `{echoed(after)}` in response {echoed(response_id)}", param="after")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}
