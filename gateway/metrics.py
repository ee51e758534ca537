"""Prometheus metrics for the gateway and the plain-ASGI middleware that times every request.

One `GatewayMetrics` per app, on its own CollectorRegistry, so several apps (tests) can live
in one process. Labels are bounded: routes from a fixed set, models from the configuration.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from adapters.base import EngineStats

# Seconds. LLM latencies span milliseconds (a cached first token) to minutes (long generations).
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0)
TOKEN_BUCKETS = (1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 131072)

ROUTES = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/models",
        "/health",
        "/ready",
        "/metrics",
    }
)
MODEL_STATE_KEY = "enginegate.model"
UNKNOWN = "unknown"

ENGINE_STAT_GAUGES: dict[str, tuple[str, str]] = {
    "requests_running": ("enginegate_engine_requests_running", "Requests the engine reports running."),
    "requests_waiting": ("enginegate_engine_requests_waiting", "Requests the engine reports queued."),
    "kv_cache_usage_ratio": ("enginegate_engine_kv_cache_usage_ratio", "KV-cache use the engine reports, 0..1."),
    "prompt_tokens_total": ("enginegate_engine_prompt_tokens", "Prompt tokens the engine reports processed (its counter)."),
    "generation_tokens_total": (
        "enginegate_engine_generation_tokens",
        "Tokens the engine reports generated (its counter; includes generations cut short).",
    ),
}


def route_label(path: str) -> str:
    if path in ROUTES:
        return path
    if path.startswith("/v1/models/"):
        return "/v1/models/{id}"
    return "other"


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "enginegate_requests", "HTTP requests by route, model and status.", ["route", "model", "status"], registry=r
        )
        self.request_duration = Histogram(
            "enginegate_request_duration_seconds",
            "Time from request arrival to the last byte of the response.",
            ["route", "model"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge("enginegate_requests_in_flight", "Requests being handled now.", ["route"], registry=r)
        self.ttft = Histogram(
            "enginegate_time_to_first_token_seconds",
            "Time from request arrival to the first generated token leaving the gateway.",
            ["model", "engine"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "enginegate_time_per_output_token_seconds",
            "Mean time between output tokens after the first, per request.",
            ["model", "engine"],
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "enginegate_queue_wait_seconds",
            "Time a request waited for a free engine slot.",
            ["model"],
            buckets=QUEUE_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "enginegate_prompt_tokens", "Prompt tokens processed.", ["model", "engine"], registry=r
        )
        self.completion_tokens = Counter(
            "enginegate_completion_tokens", "Completion tokens delivered.", ["model", "engine"], registry=r
        )
        self.queue_waiting = Gauge(
            "enginegate_queue_waiting", "Requests waiting for a free engine slot.", ["model"], registry=r
        )
        self.running = Gauge("enginegate_generations_running", "Generations in progress.", ["model"], registry=r)
        self.rejected = Counter(
            "enginegate_requests_rejected", "Requests refused because the queue was full.", ["model"], registry=r
        )
        self.disconnects = Counter(
            "enginegate_client_disconnects",
            "Streams the client closed before the end; their generation was cancelled.",
            ["model", "engine"],
            registry=r,
        )
        self.errors = Counter(
            "enginegate_errors", "Failed requests by kind of error.", ["model", "type"], registry=r
        )
        self.model_ready = Gauge("enginegate_model_ready", "1 when the model's engine is ready.", ["model", "engine"], registry=r)
        self.engine_gauges = {
            field: Gauge(name, doc, ["model", "engine"], registry=r) for field, (name, doc) in ENGINE_STAT_GAUGES.items()
        }

    def set_engine_stats(self, model: str, engine: str, stats: EngineStats) -> None:
        for field_name, gauge in self.engine_gauges.items():
            value = getattr(stats, field_name)
            if value is not None:
                gauge.labels(model, engine).set(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def set_model_label(scope: Scope, model: str) -> None:
    scope.setdefault("state", {})[MODEL_STATE_KEY] = model


class MetricsMiddleware:
    """Plain ASGI: request id, in-flight gauge, request counter and duration (to the last byte)."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        route = route_label(scope["path"])
        request_id = _header(scope, b"x-request-id") or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        status = 500
        in_flight = self.metrics.in_flight.labels(route)
        in_flight.inc()

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            in_flight.dec()
            model = scope.get("state", {}).get(MODEL_STATE_KEY, UNKNOWN)
            self.metrics.requests.labels(route, model, str(status)).inc()
            self.metrics.request_duration.labels(route, model).observe(time.perf_counter() - started)


def _header(scope: Scope, name: bytes) -> str | None:
    headers: Iterable[tuple[bytes, bytes]] = scope.get("headers", [])
    for key, value in headers:
        if key == name:
            text = value.decode("latin-1")
            return text if 0 < len(text) <= 128 else None
    return None


def request_id(scope: dict[str, Any]) -> str:
    return str(scope.get("state", {}).get("request_id") or uuid.uuid4().hex)
