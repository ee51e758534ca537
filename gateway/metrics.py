"""Prometheus metrics for the gateway and the plain-ASGI middleware that times every request.

One `GatewayMetrics` per app, on its own CollectorRegistry, so several apps (tests) can live
in one process. Labels are bounded: routes from a fixed set, models and engines from the
configuration, error types and GPU indices from fixed sets; never a string from a request.

Buckets (seconds unless named otherwise), chosen for LLM serving:
- TTFT 5 ms .. 2 min: a cached prefix answers in milliseconds, a long prompt on a CPU in minutes.
- TPOT / inter-token 1 ms .. 2.5 s: 1000 tokens/s on a big GPU to a starved CPU.
- request duration / end-to-end 5 ms .. 10 min: health checks to long generations.
- queue wait 1 ms .. 5 min; overhead 50 us .. 1 s (the gateway's own work should sit at the low end).
- tokens per request 1 .. 131072 (powers of 2-4, up to a 128k context).
"""

from __future__ import annotations

import os
import platform
import time
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import prometheus_client
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.metrics_core import Metric, SummaryMetricFamily
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from adapters.base import EngineStats
from gateway.epp_metrics import EppCollector
from gateway.exemplars import trace_exemplar
from gateway.tracing import switch
from gateway.scheduling import REFUSAL_REASONS, TIERS

if TYPE_CHECKING:
    from gateway.planning import Plan
from gateway.timing import TIMING_STATE_KEY, RequestTiming
from gateway.recent import recorder
from gateway.recent import RECORDED_ROUTES, RecentRequests

VERSION = "0.1.0"

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0)
OVERHEAD_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
LOAD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
TOKEN_BUCKETS = (1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 131072)

ROUTES = frozenset(
    {
        "/",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/models",
        "/v1/gateway/plan",
        "/v1/gateway/stats",
        "/admin/models",
        "/health",
        "/ready",
        "/metrics",
    }
)
GENERATION_ROUTES = (
    "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens",
)
ERROR_TYPES = ("client", "unsupported", "engine", "engine_stream", "internal", "cancelled")
MODEL_STATE_KEY = "enginegate.model"
OVERHEAD_HEADER = b"x-enginegate-overhead-ms"
UNKNOWN = "unknown"
MAX_INFO_LABEL = 120

ENGINE_STAT_GAUGES: dict[str, tuple[str, str]] = {
    "requests_running": ("enginegate_engine_requests_running", "Requests the engine reports running."),
    "requests_waiting": ("enginegate_engine_requests_waiting", "Requests the engine reports queued."),
    "kv_cache_usage_ratio": ("enginegate_engine_kv_cache_usage_ratio", "KV-cache use the engine reports, 0..1."),
    "prompt_tokens_total": ("enginegate_engine_prompt_tokens", "Prompt tokens the engine reports processed (its counter)."),
    "generation_tokens_total": (
        "enginegate_engine_generation_tokens",
        "Tokens the engine reports generated (its counter; includes generations cut short).",
    ),
    "draft_tokens_total": (
        "enginegate_engine_draft_tokens",
        "Speculative decoding: tokens the engine reports drafted (its counter).",
    ),
    "draft_accepted_tokens_total": (
        "enginegate_engine_draft_accepted_tokens",
        "Speculative decoding: drafted tokens the engine reports accepted (its counter).",
    ),
}


class _CachedChildren:
    """`labels()` from a dict of the children already made, keyed by the values asked for.

    prometheus_client validates, stringifies and takes a lock on every `labels()` call; the serving
    path makes a dozen a request and one per streamed token. Removing or clearing children empties
    the cache, so a removed child is never counted into again."""

    _cached: dict[tuple[object, ...], Any] | None = None

    def labels(self, *labelvalues: object, **labelkwargs: object) -> Any:
        if labelkwargs:
            return super().labels(*labelvalues, **labelkwargs)  # type: ignore[misc]
        cache = self._cached
        if cache is None:
            cache = self._cached = {}
        try:
            return cache[labelvalues]
        except KeyError:
            child = cache[labelvalues] = super().labels(*labelvalues)  # type: ignore[misc]
            return child

    def remove(self, *labelvalues: Any) -> None:
        self._cached = None
        super().remove(*labelvalues)  # type: ignore[misc]

    def remove_by_labels(self, labels: dict[str, str]) -> None:
        self._cached = None
        super().remove_by_labels(labels)  # type: ignore[misc]

    def clear(self) -> None:
        self._cached = None
        super().clear()  # type: ignore[misc]


class Counter(_CachedChildren, prometheus_client.Counter):
    pass


class Gauge(_CachedChildren, prometheus_client.Gauge):
    pass


_observe = prometheus_client.Histogram.observe  # called directly: super() costs a frame per token


class Histogram(_CachedChildren, prometheus_client.Histogram):
    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        """prometheus_client's observe, its bucket found by bisection rather than a scan of every bound in
        Python (a request makes about ten observations). With an exemplar, on a family rather than a child,
        or for NaN (which prometheus_client counts in no bucket), its own."""
        if exemplar is not None or amount != amount:
            _observe(self, amount, exemplar)
            return
        try:
            buckets, bounds, total = self._buckets, self._upper_bounds, self._sum
        except AttributeError:  # a family with labels: prometheus_client says what to do instead
            _observe(self, amount, exemplar)
            return
        total.inc(amount)
        buckets[bisect_left(bounds, amount)].inc(1)


class TracedHistogram(Histogram):
    """A latency histogram whose observations carry the current trace as an exemplar, when tracing is on
    (off: one module attribute read, as every tracing hook costs).

    prometheus_client builds a family's children with the family's own class, so every child's
    observe() is this one; each bucket keeps the last exemplar that fell into it."""

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        if exemplar is None and switch.ON:
            exemplar = trace_exemplar()
        Histogram.observe(self, amount, exemplar)

    def observe_all(self, amounts: list[float]) -> None:
        """Several observations of this child at once, as many `observe` calls would record them: each
        bucket touched and the sum are counted once (a lock each), not once per value. A stream's
        inter-token gaps come here in batches (one `observe` per token was ~2 % of a relayed stream's
        CPU). With tracing on, each value goes through `observe`, which keeps its exemplar."""
        if switch.ON:
            for amount in amounts:
                self.observe(amount)
            return
        buckets = self._buckets  # prometheus_client's non-cumulative per-bucket values
        bounds = self._upper_bounds  # ends with +Inf, so every value has a bucket
        counts: dict[int, int] = {}
        total = 0.0
        for amount in amounts:
            if amount != amount:  # NaN: prometheus_client's own (the sum, no bucket), as observe does
                _observe(self, amount, None)
                continue
            index = bisect_left(bounds, amount)  # the first bound with amount <= bound, as observe finds it
            counts[index] = counts.get(index, 0) + 1
            total += amount
        for index, count in counts.items():
            buckets[index].inc(count)
        self._sum.inc(total)


def route_label(path: str) -> str:
    if path in ROUTES:
        return path
    if path.startswith("/v1/models/"):
        return "/v1/models/{id}"
    if path.startswith("/admin/models/"):
        return "/admin/models/{id}"
    if path.startswith("/v1/responses/"):
        return "/v1/responses/{id}"
    if path.startswith("/console/"):
        return "/console"
    return "other"


class EngineTTFTCollector(Collector):
    """The engine's own TTFT (its sum and count) as a Prometheus summary, from the last poll."""

    def __init__(self) -> None:
        self.latest: dict[tuple[str, str], tuple[float, float]] = {}

    def collect(self) -> Iterator[Metric]:
        family = SummaryMetricFamily(
            "enginegate_engine_time_to_first_token_seconds",
            "Time to first token as the engine itself measures it (its running sum and count).",
            labels=["model", "engine"],
        )
        for (model, engine), (count, total) in sorted(self.latest.items()):
            family.add_metric([model, engine], count_value=count, sum_value=total)
        yield family


class GatewayMetrics:
    def __init__(self, gpu: bool = True) -> None:
        self.registry = CollectorRegistry()
        self.started_at = time.time()
        r = self.registry
        self.requests = Counter(
            "enginegate_requests", "HTTP requests by route, model and status.", ["route", "model", "status"], registry=r
        )
        self.request_duration = TracedHistogram(
            "enginegate_request_duration_seconds",
            "Time from request arrival to the last byte of the response.",
            ["route", "model"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge("enginegate_requests_in_flight", "Requests being handled now.", ["route"], registry=r)
        self.overhead = TracedHistogram(
            "enginegate_overhead_seconds",
            "The gateway's own time per request: total minus time queued for a slot and time inside the engine.",
            ["route"],
            buckets=OVERHEAD_BUCKETS,
            registry=r,
        )
        self.ttft = TracedHistogram(
            "enginegate_time_to_first_token_seconds",
            "Time from request arrival to the first generated token leaving the gateway.",
            ["model", "engine"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.tpot = TracedHistogram(
            "enginegate_time_per_output_token_seconds",
            "Mean time between output tokens after the first, per request.",
            ["model", "engine"],
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.itl = TracedHistogram(
            "enginegate_inter_token_latency_seconds",
            "Time between consecutive streamed content events (one token each for in-process engines).",
            ["model", "engine"],
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.e2e = TracedHistogram(
            "enginegate_e2e_request_latency_seconds",
            "Time from request arrival to the end of a completed generation (queue wait included).",
            ["model", "engine"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.queue_wait = TracedHistogram(
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
        self.request_prompt_tokens = Histogram(
            "enginegate_request_prompt_tokens",
            "Prompt tokens per request.",
            ["model", "engine"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.request_completion_tokens = Histogram(
            "enginegate_request_completion_tokens",
            "Completion tokens per request.",
            ["model", "engine"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.tier_queue_wait = TracedHistogram(
            "enginegate_scheduler_queue_wait_seconds",
            "Time a request waited for a free engine slot, by service tier (priority, default, flex).",
            ["model", "service_tier"],
            buckets=QUEUE_BUCKETS,
            registry=r,
        )
        self.tier_waiting = Gauge(
            "enginegate_scheduler_waiting", "Requests waiting for a free engine slot, by service tier.",
            ["model", "service_tier"], registry=r,
        )
        self.refusals = Counter(
            "enginegate_scheduler_refusals",
            "Requests the scheduler refused or took out of the queue unserved, by reason: flow_bound (the "
            "client's own queue bound), flow_share (a full queue refuses the client holding the most), "
            "class (a flex request gave its place to a higher tier), queue_full, deadline (504).",
            ["model", "reason"], registry=r,
        )
        self.preemptions = Counter(
            "enginegate_scheduler_preemptions",
            "Streams cut to give a kept slot back to a newcomer and resumed on the next free slot "
            "(scheduler.preempt).",
            ["model"], registry=r,
        )
        self.queue_waiting = Gauge(
            "enginegate_queue_waiting", "Requests waiting for a free engine slot.", ["model"], registry=r
        )
        self.queue_capacity = Gauge(
            "enginegate_queue_capacity", "Requests that may wait for a slot before the gateway answers 429.", ["model"], registry=r
        )
        self.slots = Gauge(
            "enginegate_generation_slots", "Generations the gateway lets run at once on the model's engines (all replicas; -1: no cap).", ["model"], registry=r
        )
        self.running = Gauge("enginegate_generations_running", "Generations in progress.", ["model"], registry=r)
        self.rejected = Counter(
            "enginegate_requests_rejected", "Requests refused because the queue was full.", ["model"], registry=r
        )
        self.disconnects = Counter(
            "enginegate_client_disconnects",
            "Requests the client abandoned before the end (streams, and requests still queued or generating); their work was cancelled.",
            ["model", "engine"],
            registry=r,
        )
        self.errors = Counter(
            "enginegate_errors", "Failed requests by kind of error.", ["model", "type"], registry=r
        )
        self.model_ready = Gauge("enginegate_model_ready", "1 when the model's engine is ready.", ["model", "engine"], registry=r)
        self.model_info = Gauge(
            "enginegate_model_info",
            "Always 1: which engine serves the model, the planning rule that chose it and the quantisation.",
            ["model", "engine", "rule", "quantization"],
            registry=r,
        )
        self.build_info = Gauge("enginegate_build_info", "Always 1: the gateway's version.", ["version", "python"], registry=r)
        self.build_info.labels(VERSION, platform.python_version()).set(1)
        self.engine_gauges = {
            field: Gauge(name, doc, ["model", "engine"], registry=r) for field, (name, doc) in ENGINE_STAT_GAUGES.items()
        }
        # --- replicas and routing (issue 15) ---
        self.routing_decisions = Counter(
            "enginegate_routing_decisions",
            "Requests sent to each replica, by why the balancer chose it (cache_hit, cache_load, cache_cold, "
            "least_outstanding, round_robin, affinity, affinity_spill, affinity_failover, probe, no_healthy; a LoRA "
            "adapter: adapter_loaded, adapter_load).",
            ["model", "replica", "reason"],
            registry=r,
        )
        self.retries = Counter(
            "enginegate_replica_retries",
            "Requests retried on another replica because this one failed before anything reached the client.",
            ["model", "replica"],
            registry=r,
        )
        self.replica_outstanding = Gauge(
            "enginegate_replica_outstanding", "Requests on the replica now (running and waiting for its slots).",
            ["model", "replica"], registry=r,
        )
        self.replica_slots = Gauge(
            "enginegate_replica_slots", "Generations the gateway lets run at once on the replica (-1: no cap).",
            ["model", "replica"], registry=r,
        )
        self.replica_up = Gauge(
            "enginegate_replica_up", "1 when the replica takes requests (breaker closed and its engine serving).",
            ["model", "replica", "engine"], registry=r,
        )
        self.replica_breaker = Gauge(
            "enginegate_replica_breaker_state", "1 for the replica's circuit-breaker state (closed, open, half_open).",
            ["model", "replica", "state"], registry=r,
        )
        self.replica_breaker_opens = Gauge(
            "enginegate_replica_breaker_opens", "Times the replica's circuit breaker opened since start (a counter).",
            ["model", "replica"], registry=r,
        )
        self.prefix_index_blocks = Gauge(
            "enginegate_replica_prefix_index_blocks",
            "Cache-aware routing: prompt blocks the replica's engine is believed to hold, and the index's learned "
            "capacity (kind=held|capacity).",
            ["model", "replica", "kind"], registry=r,
        )
        self.prefix_predictions = Gauge(
            "enginegate_replica_prefix_predictions",
            "Cache-aware routing: the index's predictions checked against the engine's reported reuse since start "
            "(a counter; verdict=right|over|under: it predicted what the engine reused, more, or less).",
            ["model", "replica", "verdict"], registry=r,
        )
        self.replica_prompt_tokens = Gauge(
            "enginegate_replica_prompt_tokens",
            "Cache-aware routing: prompt tokens the replica's engine reported since start, and how many it reused "
            "from its cache (a counter; kind=prompt|cached).",
            ["model", "replica", "kind"], registry=r,
        )
        self.draft_acceptance = Gauge(
            "enginegate_engine_draft_acceptance_ratio",
            "Speculative decoding: share of drafted tokens the engine accepted since it started, 0..1.",
            ["model", "engine"], registry=r,
        )
        self.engine_ttft = EngineTTFTCollector()
        r.register(self.engine_ttft)
        # issue 15b: the names an Inference Extension endpoint picker reads (vllm:*), per model
        self.epp = EppCollector()
        r.register(self.epp)
        ProcessCollector(registry=r, namespace="enginegate")
        self.gpu: Collector | None = None
        if gpu:
            from gateway.gpu import NvmlCollector

            self.gpu = NvmlCollector.discover()
            if self.gpu is not None:
                r.register(self.gpu)
        self._tracked: dict[str, tuple[str, str, str]] = {}
        for route in GENERATION_ROUTES:
            self.overhead.labels(route)
        self._lifecycle_collectors(r)

    # -- model lifecycle (issue 14): loads, evictions, load waits, fallbacks, footprints ---------------

    def _lifecycle_collectors(self, r: CollectorRegistry) -> None:
        self.model_loads = Counter("enginegate_model_loads", "Models loaded (at start-up, on demand or by an admin).",
                                   ["model", "engine"], registry=r)
        self.model_load_seconds = Histogram("enginegate_model_load_seconds", "Time an engine took to load a model.",
                                            ["model", "engine"], buckets=LOAD_BUCKETS, registry=r)
        self.model_evictions = Counter("enginegate_model_evictions", "Models unloaded, by reason (budget, ttl, admin).",
                                       ["model", "reason"], registry=r)
        self.load_wait = Histogram("enginegate_model_load_wait_seconds",
                                         "Time a request waited for its model to be loaded.", ["model"],
                                         buckets=LOAD_BUCKETS, registry=r)
        self.model_load_failures = Counter(
            "enginegate_model_load_failures",
            "Engines that failed to load a model; `fallback` names the next engine tried (none: the model failed).",
            ["model", "engine", "fallback"], registry=r)
        self.footprint_bytes = Gauge("enginegate_model_footprint_bytes",
                                     "A model's memory: the plan's estimate and the measurement after its load.",
                                     ["model", "kind"], registry=r)
        self.model_state = Gauge("enginegate_model_state", "1 for the model's lifecycle state now.",
                                 ["model", "state"], registry=r)

    def model_loaded(self, model: str, engine: str, seconds: float) -> None:
        self.model_loads.labels(model, engine).inc()
        self.model_load_seconds.labels(model, engine).observe(seconds)

    def model_load_failed(self, model: str, engine: str, fallback_to: str | None) -> None:
        self.model_load_failures.labels(model, engine, fallback_to or "none").inc()

    def model_evicted(self, model: str, reason: str) -> None:
        self.model_evictions.labels(model, reason).inc()

    def model_load_wait(self, model: str, seconds: float) -> None:
        self.load_wait.labels(model).observe(seconds)

    def model_footprint(self, model: str, estimated: int, measured: int | None) -> None:
        self.footprint_bytes.labels(model, "estimated").set(estimated)
        if measured is not None:
            self.footprint_bytes.labels(model, "measured").set(measured)

    def set_model_state(self, model: str, state: str, states: Iterable[str]) -> None:
        for s in states:
            self.model_state.labels(model, s).set(1 if s == state else 0)

    def track_model(self, model: str, engine: str, plan: Plan | None, *, slots: int, max_queue: int, quantization: str | None = None) -> None:
        """Declare a served model: its info series, its capacity, and its series at zero (so rates exist)."""
        rule, quant = plan_labels(plan, quantization)
        previous = self._tracked.get(model)
        if previous != (engine, rule, quant):
            if previous is not None:
                self.model_info.remove(model, *previous)
            self.model_info.labels(model, engine, rule, quant).set(1)
            self._tracked[model] = (engine, rule, quant)
            for kind in ERROR_TYPES:
                self.errors.labels(model, kind)
            # Every per-model series exists from the first scrape on, at zero: a series that first
            # appears already incremented hides that increment from rate() and histogram_quantile().
            for family in (self.ttft, self.tpot, self.itl, self.e2e, self.prompt_tokens, self.completion_tokens,
                           self.request_prompt_tokens, self.request_completion_tokens, self.disconnects):
                family.labels(model, engine)
            self.queue_wait.labels(model)
            self.rejected.labels(model)
            for tier in TIERS:
                self.tier_queue_wait.labels(model, tier)
                self.tier_waiting.labels(model, tier)
            for reason in REFUSAL_REASONS:
                self.refusals.labels(model, reason)
            self.preemptions.labels(model)
            for route in GENERATION_ROUTES:
                self.requests.labels(route, model, "200")
                self.request_duration.labels(route, model)
        self.slots.labels(model).set(slots)
        self.queue_capacity.labels(model).set(max_queue)

    def set_engine_stats(self, model: str, engine: str, stats: EngineStats) -> None:
        for field_name, gauge in self.engine_gauges.items():
            value = getattr(stats, field_name)
            if value is not None:
                gauge.labels(model, engine).set(value)
        if stats.ttft_seconds_count is not None and stats.ttft_seconds_sum is not None:
            self.engine_ttft.latest[(model, engine)] = (stats.ttft_seconds_count, stats.ttft_seconds_sum)
        rate = acceptance_ratio(stats)
        if rate is not None:
            self.draft_acceptance.labels(model, engine).set(rate)

    def render(self, openmetrics_format: bool = False) -> bytes:
        """The classic Prometheus text, or OpenMetrics (the only format that carries exemplars)."""
        if openmetrics_format:
            return openmetrics.generate_latest(self.registry)  # type: ignore[no-any-return]
        return generate_latest(self.registry)


def acceptance_ratio(stats: EngineStats) -> float | None:
    """Drafted tokens accepted / drafted, over the engine's life; None: nothing drafted (or not reported)."""
    drafted, accepted = stats.draft_tokens_total, stats.draft_accepted_tokens_total
    if not drafted or accepted is None:
        return None
    return accepted / drafted


def plan_labels(plan: Plan | None, quantization: str | None = None) -> tuple[str, str]:
    """(rule, quantisation): the selection rule that chose the engine, the quantisation it runs.

    The quantisation is the one the user set for the engine (`options.quantization`), else the
    model's own (a GGUF file type such as Q4_1, "4.0 bpw", ...)."""
    if plan is None:
        return _bounded(None), _bounded(quantization)
    quant = quantization or plan.options.get("quantization") or (plan.spec.quantization if plan.spec else None)
    return _bounded(plan.rule), _bounded(quant)


def _bounded(value: Any) -> str:
    text = str(value).strip() if value else UNKNOWN
    return text[:MAX_INFO_LABEL] or UNKNOWN


def set_model_label(scope: Scope, model: str) -> None:
    scope.setdefault("state", {})[MODEL_STATE_KEY] = model


class MetricsMiddleware:
    """Plain ASGI: request id, in-flight gauge, request counter, duration (to the last byte), overhead.

    Every response carries `x-enginegate-overhead-ms`: the gateway's own time until the response
    headers left (for a stream that is before the first token; the histogram covers the whole stream).
    """

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics, recent: RecentRequests | None = None) -> None:
        self.app = app
        self.metrics = metrics
        self.recent = recent

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        route = route_label(scope["path"])
        request_id = _header(scope, b"x-request-id") or new_request_id()
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        timing = state[TIMING_STATE_KEY] = RequestTiming()
        # the console's recent requests (gateway/recent) and the response facts headers, on the API routes
        facts = recorder.start(state, request_id, route, time.time(), started) if route in RECORDED_ROUTES else None
        status = 500
        in_flight = self.metrics.in_flight.labels(route)
        in_flight.inc()

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                overhead_ms = timing.overhead(time.perf_counter() - started) * 1000
                message["headers"] = [
                    *message.get("headers", []),
                    (b"x-request-id", request_id.encode()),
                    (OVERHEAD_HEADER, f"{overhead_ms:.3f}".encode()),
                    *(facts.headers(timing.queued) if facts is not None else ()),
                ]
                if facts is not None:
                    facts.trace_id = recorder.trace_id()  # here the handler's span is still the current one
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            in_flight.dec()
            total = time.perf_counter() - started
            model = scope.get("state", {}).get(MODEL_STATE_KEY, UNKNOWN)
            self.metrics.requests.labels(route, model, str(status)).inc()
            # the server span (gateway/tracing/asgi.py, outside this middleware) is still current here:
            # TracedHistogram takes its trace
            self.metrics.request_duration.labels(route, model).observe(total)
            self.metrics.overhead.labels(route).observe(timing.overhead(total))
            if facts is not None and self.recent is not None:
                recorder.finish(self.recent, scope, facts, status, total, timing.queued)


def _header(scope: Scope, name: bytes) -> str | None:
    headers: Iterable[tuple[bytes, bytes]] = scope.get("headers", [])
    for key, value in headers:
        if key == name:
            text = value.decode("latin-1")
            return text if 0 < len(text) <= 128 else None
    return None


_ids: list[str] = []
"""Request ids drawn ahead, 256 per `os.urandom` call (a system call per request was ~1 % of its CPU);
emptied in a forked child, so two processes never hand out the same ones."""
os.register_at_fork(after_in_child=_ids.clear)


def new_request_id() -> str:
    """32 random hex digits, as uuid4().hex has them (without building a UUID: this is per request)."""
    try:
        return _ids.pop()
    except IndexError:
        drawn = os.urandom(16 * 256).hex()
        _ids.extend(drawn[i:i + 32] for i in range(0, len(drawn), 32))
        return _ids.pop()


def request_id(scope: dict[str, Any]) -> str:
    return str(scope.get("state", {}).get("request_id") or new_request_id())
