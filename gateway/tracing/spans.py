"""The spans of a request, made only when `switch.ON` (callers check it first, so an untraced gateway
makes no span object). Every helper here may assume `use()` was called by `setup.configure`.

A request's trace: the server span (asgi.py), and inside it `enginegate.limits` (the tenant's key and
limits), `enginegate.queue` (the scheduler's wait; a cold start's `enginegate.model.load` with one
`enginegate.engine.start` per engine tried nests here), `enginegate.route` (the replica chosen and why),
and one GenAI client span per engine attempt (`chat <model>`), a retry being another attempt."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

from adapters.base import Completion, Usage
from gateway.tracing import attributes as attrs
from gateway.tracing import switch

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from gateway.routing import Backend, Lease
    from gateway.scheduling import Demand

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # without opentelemetry-api, configure() never turns tracing on
    pass

_tracer: Tracer | None = None
CANCELLED = "cancelled"
"""error.type of a span whose client went away before the end (499 at the server span)."""


def use(tracer: Tracer) -> None:
    global _tracer
    _tracer = tracer


def tracer() -> Tracer:
    assert _tracer is not None, "tracing.setup.configure() turns tracing on"
    return _tracer


def _error(span: Span, exc: BaseException | None, kind: str, message: str) -> None:
    span.set_attribute("error.type", kind)
    span.set_status(Status(StatusCode.ERROR, message[:512]))
    if exc is not None and isinstance(exc, Exception):
        span.record_exception(exc)


def recording() -> bool:
    """Whether this request's trace is sampled (its server span records). An unsampled request makes no child
    span: each would be a non-recording span costing as much to make as a sampled one to start (at 1 % sampling
    the 99 % paid about a quarter of the relay's top rate for spans nobody keeps)."""
    return trace.get_current_span().is_recording()


def unsampled_headers() -> dict[str, str]:
    """traceparent of an unsampled request, for the engine server: it follows the caller's decision."""
    headers: dict[str, str] = {}
    propagate.inject(headers)
    return headers


def error_kind(exc: BaseException) -> str:
    return CANCELLED if not isinstance(exc, Exception) else type(exc).__qualname__


@contextmanager
def limits(tenant: str | None) -> Iterator[Span]:
    """The key's limits (tenant name only; without keys, no tenant)."""
    with tracer().start_as_current_span("enginegate.limits") as span:
        if tenant is not None:
            span.set_attribute("enginegate.tenant", tenant)
        yield span


@contextmanager
def queue(backend: Backend, demand: Demand | None) -> Iterator[Span]:
    """The wait for a loaded model and a free slot; `waited(span, seconds)` when admitted."""
    with tracer().start_as_current_span("enginegate.queue") as span:
        if span.is_recording():
            span.set_attributes({
                "enginegate.model": backend.model_id,
                "enginegate.queue.position": sum(r.admission.waiting for r in backend.replicas),
            })
            if demand is not None:
                span.set_attributes({"enginegate.flow": demand.flow, "enginegate.service_tier": demand.tier})
        yield span


def waited(span: Span, seconds: float) -> None:
    span.set_attribute("enginegate.queue.wait_ms", round(seconds * 1000, 3))


def route(backend: Backend, lease: Lease) -> None:
    """The routing decision, as a span of the instant it was taken (inside the scheduler's admit)."""
    now = time.time_ns()
    span = tracer().start_span("enginegate.route", start_time=now)
    if span.is_recording():
        replica = lease.replica
        span.set_attributes({
            "enginegate.replica": replica.name,
            "enginegate.route.reason": lease.reason or "least_outstanding",
            "enginegate.route.affinity": backend.routing.affinity,
            "enginegate.replica.outstanding": replica.outstanding,
            "enginegate.replicas": len(backend.replicas),
        })
        placement = lease.placement
        if placement is not None:
            span.set_attribute("enginegate.route.cached_prefix_blocks", placement.predicted)
            expected = placement.precise_tokens
            if expected is None:  # a block is block_chars characters, about four to a token
                expected = placement.predicted * backend.routing.block_chars // 4
            span.set_attribute("enginegate.route.cached_prefix_tokens", expected)
        if lease.slot is not None:
            span.set_attribute("enginegate.route.slot", lease.slot)
    span.end(end_time=now)


class Attempt:
    """One call to an engine: a GenAI client span, ended by `failed`, `completed` or `stream_ended`."""

    __slots__ = ("arrived", "headers", "span")

    def __init__(self, span: Span, headers: dict[str, str], arrived: float) -> None:
        self.span = span
        self.headers = headers
        """traceparent (and tracestate) of this span, for the engine server's request."""
        self.arrived = arrived

    def failed(self, exc: BaseException) -> None:
        _error(self.span, exc, error_kind(exc), getattr(exc, "message", None) or str(exc) or type(exc).__name__)
        self.span.end()

    def completed(self, result: Completion, body: Mapping[str, Any] | None = None) -> None:
        span = self.span
        if span.is_recording():
            span.set_attributes(attrs.usage_attributes(result.usage))
            span.set_attributes(attrs.response_attributes(result.body))
            if switch.CAPTURE_CONTENT:
                out = attrs.output_messages(result.body)
                if out is not None:
                    span.set_attribute("gen_ai.output.messages", out)
            if result.status >= 400:
                _error(span, None, str(result.status), f"the engine answered {result.status}")
        span.end()

    def first_token(self, now: float) -> None:
        self.span.add_event("gen_ai.first_token", {"gen_ai.server.time_to_first_token": round(now - self.arrived, 6)})

    def stream_ended(self, usage: Usage | None, finish_reason: str | None, model: str | None,
                     ended: bool, failure: BaseException | None) -> None:
        span = self.span
        if span.is_recording():
            span.set_attributes(attrs.usage_attributes(usage))
            if model is not None:
                span.set_attribute("gen_ai.response.model", model)
            if finish_reason is not None:
                span.set_attribute("gen_ai.response.finish_reasons", (finish_reason,))
            if not ended:
                span.set_attribute("enginegate.client_disconnected", True)
                _error(span, None, CANCELLED, "cancelled: the client disconnected before the stream ended")
            elif failure is not None:
                _error(span, failure, error_kind(failure), getattr(failure, "message", None) or str(failure))
        span.end()


def attempt(operation: str, backend: Backend, lease: Lease, body: Mapping[str, Any], tried: int,
            arrived: float) -> Attempt:
    model = backend.model_id
    name = f"{attrs.OPERATION_NAMES.get(operation, operation)} {model}"
    span = tracer().start_span(name, kind=SpanKind.CLIENT)
    if span.is_recording():
        span.set_attributes(attrs.request_attributes(operation, backend.engine, model, body))
        span.set_attributes({"enginegate.replica": lease.replica.name, "enginegate.attempt": tried + 1})
        if switch.CAPTURE_CONTENT:
            prompt = attrs.input_messages(body)
            if prompt is not None:
                span.set_attribute("gen_ai.input.messages", prompt)
    headers: dict[str, str] = {}
    propagate.inject(headers, context=trace.set_span_in_context(span))
    return Attempt(span, headers, arrived)


@asynccontextmanager
async def model_load(model: str) -> AsyncIterator[Span]:
    with tracer().start_as_current_span("enginegate.model.load", attributes={"enginegate.model": model}) as span:
        yield span


@asynccontextmanager
async def engine_start(model: str, engine: str) -> AsyncIterator[Span]:
    """One engine tried for a load: a failure here is the fallback's reason (the span's error)."""
    with tracer().start_as_current_span("enginegate.engine.start",
                                        attributes={"enginegate.model": model, "enginegate.engine": engine}) as span:
        yield span

