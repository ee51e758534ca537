"""Plain ASGI auth: find the key, check the route's role (access.ROUTE_ACCESS), put the Caller in
the scope; then add the rate-limit headers to the response and settle the request's ticket when
the response ends (after its last byte: the client does not wait for the write; a next request of
the key that holds a concurrency slot waits for its release in the service, Tenancy.reserve).

The serving flow meets it through `key_of`, `may_use` and `reserve` (the scope carries the key,
the decision and the ticket)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.errors import echoed
from gateway.identity import set_caller
from gateway.middleware import bearer_token, send_error
from gateway.tenancy.access import required_access
from gateway.tenancy.keys import KeyRecord, UnreadableKey, allows_model
from gateway.tenancy.limits import Decision, Reservation, anthropic_headers, rate_headers, refusal_message, retry_after_ms
from gateway.tenancy.service import Refused, Tenancy
from gateway.tenancy.store import StoreUnavailable
from gateway.tenancy.ticket import Ticket
from gateway.timing import request_timing

log = logging.getLogger("enginegate.auth")
_warned: set[str] = set()
KEY_STATE = "enginegate.key"
DECISION_STATE = "enginegate.ratelimit"
TICKET_STATE = "enginegate.ticket"
ANTHROPIC_PREFIX = "/v1/messages"
CLIENT_CLOSED = 499


def _state(scope: Scope) -> dict[str, Any]:
    return scope.setdefault("state", {})  # type: ignore[no-any-return]


def key_of(scope: Scope) -> KeyRecord | None:
    record = scope.get("state", {}).get(KEY_STATE)
    return record if isinstance(record, KeyRecord) else None


def may_use(scope: Scope, model_id: str, aliases: tuple[str, ...] = ()) -> bool:
    """The key's model list allows it (no key, or an empty list: every model)."""
    record = key_of(scope)
    return record is None or allows_model(record.policy, model_id, aliases)


async def reserve(scope: Scope, tenancy: Tenancy | None, model_id: str, charge: Reservation) -> Ticket:
    """Admit the request against its key's limits, reserving `charge`; raises Refused or StoreUnavailable.
    Without a key the ticket is inert."""
    record = key_of(scope)
    if record is None or tenancy is None:
        return Ticket("", model_id, settled=True)
    try:
        ticket = await tenancy.reserve(record, model_id, charge)
    except Refused as exc:
        _state(scope)[DECISION_STATE] = exc.decision
        raise
    state = _state(scope)
    state[TICKET_STATE] = ticket
    if ticket.decision is not None:
        state[DECISION_STATE] = ticket.decision
    return ticket


def refusal(decision: Decision, default_retry_s: int, cost: int | None = None) -> tuple[str, dict[str, str]]:
    """(message, headers) of the 429 for a refused decision (`cost`: the request's reservation); a spent
    budget, or one the request does not fit, says not to retry."""
    message = refusal_message(decision, cost)
    wait_ms = retry_after_ms(decision, default_retry_s * 1000)
    headers = {"Retry-After": str(max(1, math.ceil(wait_ms / 1000))), "retry-after-ms": str(wait_ms)}
    if decision.refused == "budget":
        headers["x-should-retry"] = "false"
    return message, headers


def _token(scope: Scope) -> bytes:
    return next((bearer_token(v) for k, v in scope.get("headers", []) if k == b"authorization"), b"")


class AuthMiddleware:
    def __init__(self, app: ASGIApp, tenancy: Tenancy, retry_after_seconds: int = 1) -> None:
        self.app = app
        self.tenancy = tenancy
        self.retry_after = retry_after_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        access = required_access(scope["path"])
        token = _token(scope)
        if access in ("public", "metrics"):
            if token and access == "public":  # /ready shows more to an admin; a bad key there is no error
                with contextlib.suppress(StoreUnavailable, UnreadableKey):
                    record = await self.tenancy.authenticate(token)
                    if record is not None:
                        self._identify(scope, record)
            await self.app(scope, receive, send)
            return
        record = None
        if token:
            try:
                record = await self.tenancy.authenticate(token)
            except StoreUnavailable:
                await send_error(send, 503, "The key store is unreachable; try again shortly.", "store_unavailable",
                                 [(b"retry-after", str(self.retry_after).encode())])
                return
            except UnreadableKey as exc:  # fail closed, in the API's shape: never a plain-text 500
                if str(exc) not in _warned:  # once, not on every request of the key
                    _warned.add(str(exc))
                    log.warning("%s", exc)
                await send_error(send, 401, "This API key's record was written by a newer enginegate and cannot be "
                                 "read by this gateway; ask its operator to upgrade it.", "invalid_api_key",
                                 [(b"www-authenticate", b"Bearer")])
                return
        if record is None:
            if not await self.tenancy.required():  # no keys anywhere: every route is open
                await self.app(scope, receive, send)
                return
            message = "Incorrect, revoked or expired API key." if token else "Missing API key: send Authorization: Bearer <key>"
            await send_error(send, 401, message, "invalid_api_key", [(b"www-authenticate", b"Bearer")])
            return
        if access == "admin" and not record.caller().is_admin:
            await send_error(send, 403, f"{echoed(scope['path'])} needs a key with role admin.", "permission_denied")
            return
        self._identify(scope, record)
        await self._serve(scope, receive, send)

    @staticmethod
    def _identify(scope: Scope, record: KeyRecord) -> None:
        set_caller(scope, record.caller())
        _state(scope)[KEY_STATE] = record

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = _state(scope)
        status = CLIENT_CLOSED
        anthropic = scope["path"].startswith(ANTHROPIC_PREFIX)

        async def respond(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                decision = state.get(DECISION_STATE)
                if isinstance(decision, Decision):
                    extra = anthropic_headers(decision, time.time()) if anthropic else rate_headers(decision)
                    message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                ticket = state.get(TICKET_STATE)
                if isinstance(ticket, Ticket) and not ticket.settled:
                    await self._settle(scope, ticket, status)

        try:
            await self.app(scope, receive, respond)
        finally:
            ticket = state.get(TICKET_STATE)
            if isinstance(ticket, Ticket) and not ticket.settled:
                await asyncio.shield(self._settle(scope, ticket, status))

    async def _settle(self, scope: Scope, ticket: Ticket, status: int) -> None:
        """Queued for the writer, not waited for: the response is complete, and the request's measured duration
        (MetricsMiddleware, outside this one) must not include the write."""
        await self.tenancy.settle(ticket, failed=status >= 400, engine_s=request_timing(scope).upstream, wait=False)

