"""The HTTP server around the app: uvicorn, with a drain on SIGTERM, slow-client timeouts and a
connection cap.

- SIGTERM/SIGINT once: drain (gateway/drain.py), then exit; a second signal exits at once.
- A connection that has not sent complete request headers within `header_timeout_seconds` is
  answered 408 and closed (uvicorn has no header timeout; its keep-alive timer stops at the first
  byte, so a client dribbling headers would hold the connection forever). The body timeout is
  the body-limit middleware's (gateway/middleware.py).
- More than `max_connections` connections or requests at once: uvicorn answers 503.
"""

from __future__ import annotations

import asyncio
from types import FrameType

import orjson
import uvicorn
from fastapi import FastAPI

from gateway.api.errors import error_payload
from gateway.config import Settings
from gateway.drain import Drain

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - httptools comes with uvicorn[standard]
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

_TIMEOUT_BODY = orjson.dumps(error_payload(408, "request headers not received in time", code="request_timeout"))
TIMEOUT_RESPONSE = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
                    b"content-length: " + str(len(_TIMEOUT_BODY)).encode() + b"\r\n\r\n" + _TIMEOUT_BODY)


def header_timeout_protocol(timeout: float) -> type[asyncio.Protocol] | str:
    """uvicorn's httptools protocol with a deadline for each request's headers."""
    if HttpToolsProtocol is None:
        return "auto"

    class HeaderTimeoutProtocol(HttpToolsProtocol):  # type: ignore[misc,valid-type]
        _header_timer: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(timeout, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
                self.transport.write(TIMEOUT_RESPONSE)
                self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # the next request on this connection has the same deadline

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderTimeoutProtocol


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose first SIGTERM/SIGINT drains before exiting."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None

    async def serve(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain.draining or self.should_exit or self._loop is None or not self.started:
            super().handle_exit(sig, frame)  # a second signal, or one before serving: exit now
            return
        self._captured_signals.append(sig)  # re-raised after shutdown, so the exit status tells why
        self.drain.draining = True  # from this instruction on, new requests get 503
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        assert self._loop is not None
        self._drain_task = self._loop.create_task(self.drain.run(), name="drain")
        self._drain_task.add_done_callback(lambda _: setattr(self, "should_exit", True))


def build_server(app: FastAPI, settings: Settings) -> DrainingServer:
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        # uvicorn's access lines are info: above it they are never written, yet their arguments (client
        # address, path) would still be formatted on every request
        access_log=settings.log_level.lower() in ("trace", "debug", "info"),
        http=header_timeout_protocol(settings.header_timeout_seconds),
        limit_concurrency=settings.max_connections,
        timeout_graceful_shutdown=5,
    )
    return DrainingServer(config, app.state.drain)
