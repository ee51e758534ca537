"""Plain ASGI middleware: API-key auth and the request body limit."""

from __future__ import annotations

import hmac

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.errors import BodyTooLarge, error_payload


async def _send_error(send: Send, status: int, message: str, code: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = orjson.dumps(error_payload(status, message, code=code))
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *(headers or [])],
        }
    )
    await send({"type": "http.response.body", "body": body})


PROTECTED_PREFIXES = ("/v1/", "/admin/")


def bearer_token(authorization: bytes) -> bytes:
    """The token of an `Authorization: Bearer <token>` header value; empty for any other scheme."""
    return authorization[7:].strip() if authorization[:7].lower() == b"bearer " else b""


class APIKeyMiddleware:
    """Requires `Authorization: Bearer <key>` on /v1 and /admin routes when keys are configured."""

    def __init__(self, app: ASGIApp, keys: tuple[str, ...]) -> None:
        self.app = app
        self.keys = tuple(k.encode() for k in keys)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or not scope["path"].startswith(PROTECTED_PREFIXES):
            await self.app(scope, receive, send)
            return
        token = b""
        for key, value in scope.get("headers", []):
            if key == b"authorization":
                token = bearer_token(value)
        if not any(hmac.compare_digest(token, k) for k in self.keys):
            await _send_error(send, 401, "Incorrect or missing API key: send Authorization: Bearer <key>", "invalid_api_key",
                              [(b"www-authenticate", b"Bearer")])
            return
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """Refuses bodies over `limit` bytes with 413, by Content-Length or while reading."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for key, value in scope.get("headers", []):
            if key == b"content-length" and value.isdigit() and int(value) > self.limit:
                await _send_error(send, 413, f"request body exceeds {self.limit} bytes", "request_too_large")
                return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        await self.app(scope, limited_receive, send)
