"""The two calls MetricsMiddleware makes for a recorded route: `start` when the request arrives and
`finish` after its last byte (or when its client left). Cost on the request path: one small object,
a context-variable read for the trace id, one ring append."""

from __future__ import annotations

from typing import Any

from starlette.types import Scope

from gateway.identity import CALLER_STATE, Caller
from gateway.recent.facts import CLIENT_CLOSED, FACTS_STATE_KEY, RequestFacts
from gateway.recent.ring import RecentRequests
from gateway.tenancy.limits import Decision
from gateway.tenancy.middleware import DECISION_STATE

try:
    from opentelemetry import trace as _otel
except ImportError:  # pragma: no cover - opentelemetry-api comes with the tracing extra
    _otel = None  # type: ignore[assignment]

MODEL_STATE_KEY = "enginegate.model"  # gateway.metrics.MODEL_STATE_KEY (set by set_model_label)


def trace_id() -> str | None:
    """The current span's trace id (32 hex digits) when a span is recording, else None."""
    if _otel is None:
        return None
    span = _otel.get_current_span()
    if not span.is_recording():
        return None
    return format(span.get_span_context().trace_id, "032x")


def start(state: dict[str, Any], request_id: str, endpoint: str, created: float, started: float) -> RequestFacts:
    facts = state[FACTS_STATE_KEY] = RequestFacts(request_id, created, endpoint, started)
    return facts


def finish(ring: RecentRequests, scope: Scope, facts: RequestFacts, status: int, total_s: float, queued_s: float) -> None:
    """The trace id is the one MetricsMiddleware read when the response started (a request that raised
    before it has none)."""
    state = scope["state"]  # MetricsMiddleware made it
    caller = state.get(CALLER_STATE)
    facts.status = CLIENT_CLOSED if facts.abandoned else status
    facts.tenant = caller.name if type(caller) is Caller else None
    model = state.get(MODEL_STATE_KEY)
    facts.model = model if type(model) is str else None
    facts.queue_s = queued_s
    facts.total_s = total_s
    decision = state.get(DECISION_STATE)
    ring.record(facts, decision if type(decision) is Decision else None)
