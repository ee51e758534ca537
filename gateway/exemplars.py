"""Trace-id exemplars for the latency histograms (OpenMetrics), so a slow bucket links to its trace.

`trace_exemplar()` reads the current OpenTelemetry span context (the one gateway/tracing made
current for the request); it names a trace only when that span is sampled, since an unsampled
trace was never exported and a link to it would lead nowhere. It is called only by histograms
built with exemplars on (tracing on): with tracing off nothing here runs, nor is
opentelemetry imported.
"""

from __future__ import annotations

from typing import Any

_get_current_span: Any = None


def _current_span() -> Any:
    global _get_current_span
    if _get_current_span is None:
        from opentelemetry.trace import get_current_span

        _get_current_span = get_current_span
    return _get_current_span()


_last: tuple[Any, dict[str, str]] | None = None
"""The last span context's exemplar: a stream observes once per token in the same span, so the hex
is formatted once (SpanContext is immutable: the same object is the same span; the labels are never
mutated, so sharing the dict between observations is safe)."""


def trace_exemplar() -> dict[str, str] | None:
    """{"trace_id", "span_id"} of the current sampled span (hex, as Jaeger and Tempo show them), else None."""
    global _last
    context = _current_span().get_span_context()
    if not context.trace_flags & 0x01:  # not sampled; the invalid (no span) context has no flags either
        return None
    last = _last
    if last is not None and last[0] is context:
        return last[1]
    labels = {"trace_id": format(context.trace_id, "032x"), "span_id": format(context.span_id, "016x")}
    _last = (context, labels)
    return labels


OPENMETRICS = "application/openmetrics-text"


def wants_openmetrics(accept: str) -> bool:
    """Whether a scraper asked for OpenMetrics (Prometheus does by default); exemplars exist only there."""
    for part in accept.split(","):
        mime, *params = (token.strip().lower() for token in part.split(";"))
        if mime == OPENMETRICS and not any(p.replace(" ", "") in ("q=0", "q=0.0", "q=0.00", "q=0.000") for p in params):
            return True
    return False
