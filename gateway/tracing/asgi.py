"""The server span: plain ASGI, outermost, installed only when tracing is on (the app without it
runs exactly as an untraced one). The caller's W3C traceparent/tracestate is continued.

Hand-written rather than opentelemetry-instrumentation-asgi: that one wraps every send and receive
in spans of their own and builds its attributes per message; here one span per request, made once."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry import context, propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.tracing import attributes as attrs
from gateway.tracing import spans


class _HeaderGetter:
    """opentelemetry's Getter over ASGI's list of (bytes, bytes) headers."""

    def get(self, carrier: Iterable[tuple[bytes, bytes]], key: str) -> list[str] | None:
        wanted = key.encode("latin-1")
        found = [v.decode("latin-1") for k, v in carrier if k == wanted]
        return found or None

    def keys(self, carrier: Iterable[tuple[bytes, bytes]]) -> list[str]:
        return [k.decode("latin-1") for k, _ in carrier]


GETTER = _HeaderGetter()


class TracingMiddleware:
    def __init__(self, app: ASGIApp, hot_paths: Iterable[str] = ()) -> None:
        self.app = app
        self.hot_paths = frozenset(hot_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        parent = propagate.extract(scope.get("headers", []), getter=GETTER)  # type: ignore[arg-type]
        method = scope.get("method", "GET")
        span = spans.tracer().start_span(method, context=parent, kind=SpanKind.SERVER)  # the samplers read no attribute
        token = context.attach(trace.set_span_in_context(span, parent))
        if not span.is_recording():  # unsampled: nothing to describe, and no child span is made (spans.recording)
            try:
                await self.app(scope, receive, send)
            finally:
                context.detach(token)
            return
        span.set_attributes(attrs.http_server_attributes(scope))
        status: list[int] = []

        async def traced_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, traced_send)
        except BaseException as exc:
            spans._error(span, exc, spans.error_kind(exc), str(exc) or type(exc).__name__)
            raise
        finally:
            context.detach(token)
            _finish(span, scope, status, self.hot_paths)


def _finish(span: Any, scope: Mapping[str, Any], status: list[int], hot_paths: frozenset[str]) -> None:
    route = attrs.route_of(scope, hot_paths)
    if route is not None:
        span.update_name(f"{scope.get('method', 'GET')} {route}")
        span.set_attribute("http.route", route)
    if status:
        code = status[0]
        span.set_attribute("http.response.status_code", code)
        if code >= 500:
            span.set_attribute("error.type", str(code))
            span.set_status(Status(StatusCode.ERROR))
    span.end()
