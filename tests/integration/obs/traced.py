"""A gateway traced into the real receiver of tests/otlp_receiver.py (Phoenix), and a caller's traceparent."""

from __future__ import annotations

import os

from tests.otlp_receiver import Receiver

SPANS_GUARD_S = 120.0  # hang guard for spans to arrive, not a performance assertion


def tracing_env(receiver: Receiver) -> dict[str, str]:
    """OTLP/HTTP into the receiver, exporting at once rather than every 5 s."""
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.otlp_endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_SERVICE_NAME": "enginegate", "OTEL_BSP_SCHEDULE_DELAY": "200"}


def traceparent() -> tuple[str, str]:
    """A caller's W3C traceparent (sampled) and its trace id."""
    trace_id, parent = os.urandom(16).hex(), os.urandom(8).hex()
    return f"00-{trace_id}-{parent}-01", trace_id
