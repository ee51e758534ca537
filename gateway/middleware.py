"""Plain ASGI middleware: the request body limit and deadline (auth: gateway/tenancy/middleware.py)."""

from __future__ import annotations

import asyncio

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.errors import BodyTimeout, BodyTooLarge, error_payload


async def send_error(send: Send, status: int, message: str, code: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = orjson.dumps(error_payload(status, message, code=code))
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *(headers or [])],
        }
    )
    await send({"type": "http.response.body", "body": body})


def bearer_token(authorization: bytes) -> bytes:
    """The token of an `Authorization: Bearer <token>` header value; empty for any other scheme."""
    return authorization[7:].strip() if authorization[:7].lower() == b"bearer " else b""


class BodyLimitMiddleware:
    """Refuses bodies over `limit` bytes with 413, by Content-Length or while reading, and bodies
    not complete `timeout` seconds after the first read with 408 (a slow or stalled client)."""

    def __init__(self, app: ASGIApp, limit: int, timeout: float | None = None) -> None:
        self.app = app
        self.limit = limit
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for key, value in scope.get("headers", []):
            if key == b"content-length" and value.isdigit() and int(value) > self.limit:
                await send_error(send, 413, f"request body exceeds {self.limit} bytes", "request_too_large")
                return
        received = 0
        complete = False
        deadline: float | None = None

        async def limited_receive() -> Message:
            nonlocal received, complete, deadline
            if complete or self.timeout is None:  # after the body only http.disconnect comes: no deadline
                message = await receive()
            else:
                loop = asyncio.get_running_loop()
                deadline = deadline if deadline is not None else loop.time() + self.timeout
                try:
                    async with asyncio.timeout_at(deadline):
                        message = await receive()
                except TimeoutError:
                    raise BodyTimeout(self.timeout) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                complete = not message.get("more_body", False)
                if received > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        await self.app(scope, limited_receive, send)
