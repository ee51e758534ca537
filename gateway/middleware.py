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
        clock: BodyClock | None = None

        async def limited_receive() -> Message:
            nonlocal received, complete, clock
            if complete or self.timeout is None:  # after the body only http.disconnect comes: no deadline
                message = await receive()
            else:
                clock = clock or BodyClock(self.timeout)
                try:
                    message = await clock.receive(receive)
                except TimeoutError:
                    raise BodyTimeout(self.timeout) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                complete = not message.get("more_body", False)
                if complete and clock is not None:
                    clock.stop()
                if received > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        try:
            await self.app(scope, limited_receive, send)
        finally:
            if clock is not None:
                clock.stop()


class BodyClock:
    """`timeout` seconds from the first read for the whole body: `asyncio.timeout_at` for each read, at
    the cost of one timer per request (a `Timeout` per read was ~3 % of a relayed request's CPU).

    The timer cancels the reading task only while a read waits (`receive` then raises TimeoutError, as
    asyncio's timeout does, and a cancellation of someone else's still propagates); once it has fired,
    every later read raises at once. `stop()` when the body is complete or the request ends."""

    __slots__ = ("_fired", "_task", "_timer", "expired")

    def __init__(self, timeout: float) -> None:
        self.expired = False
        self._fired = False
        self._task: asyncio.Task[object] | None = None  # the task of a read that waits now
        self._timer = asyncio.get_running_loop().call_later(timeout, self._expire)

    def _expire(self) -> None:
        self.expired = True
        if self._task is not None:
            self._fired = True
            self._task.cancel()

    async def receive(self, receive: Receive) -> Message:
        if self.expired:
            raise TimeoutError
        task = self._task = asyncio.current_task()
        assert task is not None
        cancelling = task.cancelling()
        try:
            message = await receive()
        except asyncio.CancelledError:
            if self._fired and task.uncancel() <= cancelling:
                raise TimeoutError from None
            raise
        finally:
            self._task = None
        if self._fired and task.uncancel() <= cancelling:
            raise TimeoutError  # it fired as the message came: past the deadline all the same
        return message

    def stop(self) -> None:
        self._timer.cancel()
