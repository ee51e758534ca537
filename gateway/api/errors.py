"""OpenAI-shaped errors: every failure leaves the gateway as {"error": {message, type, param, code}}."""

from __future__ import annotations

import logging
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from adapters.base import ClientRequestError, EngineError, UnsupportedError
from adapters.upstream_errors import error_type

log = logging.getLogger("enginegate.api")
CLIENT_CLOSED = 499  # nginx's status for a request its client abandoned; never seen by that client
MAX_ECHOED = 64


def echoed(text: str) -> str:
    """A client's name, id or path as an error message repeats it: at most 64 characters of it."""
    return text if len(text) <= MAX_ECHOED else text[:MAX_ECHOED] + "..."


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"request body exceeds {limit} bytes")
        self.limit = limit


class BodyTimeout(Exception):
    def __init__(self, timeout: float) -> None:
        super().__init__(f"request body not received within {timeout:.0f}s")


def error_payload(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": error_type(status),
            "param": param,
            "code": code,
        }
    }


def error_response(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    return Response(
        orjson.dumps(error_payload(status, message, param, code)),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    return (f"{param}: {first.get('msg')}" if param else str(first.get("msg"))), param


def install_error_handlers(app: FastAPI) -> None:
    async def on_api_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, APIError)
        return error_response(exc.status, exc.message, exc.param, exc.code, exc.headers)

    async def on_validation(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        message, param = _validation_message(exc)
        return error_response(400, message, param)

    async def on_http(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        code = "not_found" if exc.status_code == 404 else None
        return error_response(exc.status_code, str(exc.detail), code=code, headers=getattr(exc, "headers", None))

    async def on_unsupported(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, UnsupportedError)
        return error_response(400, exc.message, exc.param, "unsupported_parameter")

    async def on_client_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, ClientRequestError)
        return error_response(exc.status, exc.message, exc.param, exc.code)

    async def on_engine_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, EngineError)
        return error_response(exc.status, exc.message, code=exc.code or "engine_error")

    async def on_too_large(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, BodyTooLarge)
        return error_response(413, str(exc), code="request_too_large")

    async def on_body_timeout(_: Request, exc: Exception) -> Response:
        return error_response(408, str(exc), code="request_timeout", headers={"Connection": "close"})

    async def on_client_disconnect(request: Request, _: Exception) -> Response:
        # The client left while sending its body (an aborted upload, a broken chunked body): its
        # doing, not the gateway's. One line, counted as 499, never a 500 or a traceback.
        log.info("client disconnected while sending the request body (%s %s)", request.method, request.url.path)
        return Response(status_code=CLIENT_CLOSED)

    async def on_unexpected(_: Request, exc: Exception) -> Response:
        return error_response(500, f"internal error: {type(exc).__name__}", code="internal_error")

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(UnsupportedError, on_unsupported)
    app.add_exception_handler(ClientRequestError, on_client_error)
    app.add_exception_handler(EngineError, on_engine_error)
    app.add_exception_handler(BodyTooLarge, on_too_large)
    app.add_exception_handler(BodyTimeout, on_body_timeout)
    app.add_exception_handler(ClientDisconnect, on_client_disconnect)
    app.add_exception_handler(Exception, on_unexpected)
