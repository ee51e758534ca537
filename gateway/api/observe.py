"""/metrics (Prometheus text, or OpenMetrics with exemplars when asked; optionally behind a key) and /v1/gateway/stats (a JSON summary for the status page)."""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Awaitable
from typing import Any

from fastapi import APIRouter, Request
from prometheus_client.metrics_core import Metric
from starlette.responses import Response

from adapters.base import EngineStats
from gateway.api.errors import error_response
from gateway.api.scheduling import refresh_tiers
from gateway.api.serving import metrics, runtime
from gateway.epp_metrics import ModelLoad, ReplicaLoad, ServedNames, model_load
from gateway.exemplars import wants_openmetrics
from gateway.metrics import GENERATION_ROUTES, GatewayMetrics
from gateway.middleware import bearer_token
from gateway.routing import Backend, State
from gateway.routing.health import BreakerState
from gateway.routing.pool import Replica
from gateway.routing.registry import loaded_loras
from gateway.runtime import Runtime
from gateway.scheduling import REFUSAL_REASONS, TIERS

log = logging.getLogger("enginegate.metrics")
router = APIRouter()
STATS_TIMEOUT_S = 2.0
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_TEXT = "application/openmetrics-text; version=1.0.0; charset=utf-8"


async def _bounded(model: str, read: Awaitable[EngineStats | None]) -> EngineStats | None:
    try:
        return await asyncio.wait_for(read, STATS_TIMEOUT_S)
    except Exception as exc:  # TimeoutError included: a slow engine must not stall the scrape
        log.debug("engine stats for %s unavailable: %s", model, exc)
        return None


def _replica_load(replica: Replica, stats: EngineStats | None) -> ReplicaLoad:
    admission = replica.admission
    slots = admission.concurrency
    return ReplicaLoad(admission.waiting, admission.running, slots if slots else None, stats)


async def refresh(m: GatewayMetrics, rt: Runtime, epp: bool = True) -> dict[str, bool]:
    """Bring the polled gauges up to date (queue, readiness, the engines' own stats); returns readiness.

    The engine's own gauges (enginegate_engine_*) and the endpoint picker's (`epp`, vllm:*) cover
    every replica of a model."""
    ready: dict[str, bool] = {}
    loads: dict[str, ModelLoad] = {}
    names_ready: list[str] = []
    names_not_ready: list[str] = []
    for backend in rt.models:
        m.track_model(
            backend.model_id,
            backend.engine,
            backend.plan if backend.plan is not None else rt.plans.get(backend.model_id),
            slots=-1 if backend.slots is None else backend.slots,
            max_queue=backend.max_queue,
        )
        if backend.lifecycle is not None:
            m.set_model_state(backend.model_id, backend.lifecycle.state.value, (st.value for st in State))
        m.queue_waiting.labels(backend.model_id).set(backend.waiting)
        refresh_tiers(m, backend)
        m.running.labels(backend.model_id).set(backend.running)
        health = await backend.health()
        ready[backend.model_id] = health.ready
        m.model_ready.labels(backend.model_id, backend.engine).set(1 if health.ready else 0)
        replicas = backend.replicas or []
        per_replica: list[EngineStats | None]
        if len(replicas) == 1:
            stats = await _bounded(backend.model_id, replicas[0].adapter.engine_stats())
            per_replica = [stats]
        else:  # the model's figures (summed as Backend.engine_stats says) and, for the picker, each replica's
            stats, *per_replica = await asyncio.gather(
                _bounded(backend.model_id, backend.engine_stats()),
                *(_bounded(backend.model_id, r.adapter.engine_stats()) for r in replicas))
        if stats is not None:
            m.set_engine_stats(backend.model_id, backend.engine, stats)
        _refresh_replicas(m, backend)
        if epp:
            loads[backend.model_id] = model_load([_replica_load(r, s) for r, s in zip(replicas, per_replica)])
            (names_ready if health.ready else names_not_ready).extend((backend.model_id, *backend.aliases))
            # a LoRA adapter is running where a replica's engine has it loaded (all of them at start, or what
            # runtime loading has loaded now), waiting elsewhere
            loaded = frozenset().union(*(loaded_loras(r.adapter) for r in replicas)) if health.ready else frozenset()
            for child in backend.children:
                (names_ready if child.model_id in loaded else names_not_ready).append(child.model_id)
    if epp:
        m.epp.update(loads, ServedNames(tuple(names_ready), tuple(names_not_ready)))
    return ready


def _refresh_replicas(m: GatewayMetrics, backend: Backend) -> None:
    """Per-replica state (issue 15): load, slots, breaker."""
    for replica in backend.replicas:
        labels = (backend.model_id, replica.name)
        m.replica_outstanding.labels(*labels).set(replica.outstanding)
        slots = replica.admission.concurrency
        m.replica_slots.labels(*labels).set(-1 if slots is None else slots)
        up = replica.breaker.state is not BreakerState.OPEN and not replica.down()
        m.replica_up.labels(*labels, replica.adapter.engine).set(1 if up else 0)
        for state in BreakerState:
            m.replica_breaker.labels(*labels, state.value).set(1 if replica.breaker.state is state else 0)
        m.replica_breaker_opens.labels(*labels).set(replica.breaker.opens)
        affinity = backend.routing.affinity
        first_reason = backend.routing.balance if affinity == "none" else "cache_hit" if affinity == "cache" else "affinity"
        m.routing_decisions.labels(*labels, first_reason)  # exists at zero from the first scrape
        cache = replica.cache
        if cache is not None:
            m.prefix_index_blocks.labels(*labels, "held").set(len(cache.index))
            m.prefix_index_blocks.labels(*labels, "capacity").set(cache.index.capacity)
            for verdict in ("right", "over", "under"):
                m.prefix_predictions.labels(*labels, verdict).set(getattr(cache.counts, verdict))
            m.replica_prompt_tokens.labels(*labels, "prompt").set(cache.counts.prompt_tokens)
            m.replica_prompt_tokens.labels(*labels, "cached").set(cache.counts.cached_tokens)


def _authorized(request: Request, key: str) -> bool:
    token = bearer_token(request.headers.get("authorization", "").encode("latin-1"))
    return hmac.compare_digest(token, key.encode())


@router.get("/metrics")
async def prometheus_metrics(request: Request) -> Response:
    key: str | None = request.app.state.settings.metrics_api_key
    if key and not _authorized(request, key):
        return error_response(401, "/metrics needs Authorization: Bearer <metrics_api_key>", code="invalid_api_key",
                              headers={"WWW-Authenticate": "Bearer"})
    m = metrics(request)
    await refresh(m, runtime(request), epp=request.app.state.settings.epp_metrics)
    if wants_openmetrics(request.headers.get("accept", "")):  # Prometheus asks for it; exemplars exist only there
        return Response(m.render(openmetrics_format=True), media_type=OPENMETRICS_TEXT)
    return Response(m.render(), media_type=PROMETHEUS_TEXT)


def _samples(metric: Any, name: str, **labels: str) -> float:
    total = 0.0
    family: Metric
    for family in metric.collect():
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def _histogram(metric: Any, prefix: str, model: str) -> dict[str, float]:
    return {"sum": _samples(metric, f"{prefix}_sum", model=model), "count": _samples(metric, f"{prefix}_count", model=model)}


def summarize(m: GatewayMetrics, rt: Runtime, ready: dict[str, bool]) -> dict[str, Any]:
    """Running totals (counters, histogram sums and counts); a client derives rates from two readings."""
    models: dict[str, Any] = {}
    for backend in rt.models:
        mid = backend.model_id
        requests = sum(_samples(m.requests, "enginegate_requests_total", route=route, model=mid) for route in GENERATION_ROUTES)
        models[mid] = {
            "engine": backend.engine,
            "ready": ready.get(mid, False),
            "requests": requests,
            "errors": _samples(m.errors, "enginegate_errors_total", model=mid),
            "rejected": _samples(m.rejected, "enginegate_requests_rejected_total", model=mid),
            "prompt_tokens": _samples(m.prompt_tokens, "enginegate_prompt_tokens_total", model=mid),
            "completion_tokens": _samples(m.completion_tokens, "enginegate_completion_tokens_total", model=mid),
            "ttft_seconds": _histogram(m.ttft, "enginegate_time_to_first_token_seconds", mid),
            "tpot_seconds": _histogram(m.tpot, "enginegate_time_per_output_token_seconds", mid),
            "e2e_seconds": _histogram(m.e2e, "enginegate_e2e_request_latency_seconds", mid),
            "running": backend.running,
            "waiting": backend.waiting,
            "slots": backend.slots,
            "max_queue": backend.max_queue,
            "routing": backend.routing.model_dump(include={"balance", "affinity", "load_factor"}),
            "scheduler": _scheduler(m, backend),
            "replicas": [replica.status() for replica in backend.replicas],
            **({"cache_peers": backend.peers.status()} if backend.peers is not None else {}),
            "speculation": _speculation(m, mid, backend.engine),
            **(_lifecycle(backend.lifecycle.view()) if backend.lifecycle is not None else {}),
        }
    overhead = {"sum": 0.0, "count": 0.0}
    for route in GENERATION_ROUTES:
        overhead["sum"] += _samples(m.overhead, "enginegate_overhead_seconds_sum", route=route)
        overhead["count"] += _samples(m.overhead, "enginegate_overhead_seconds_count", route=route)
    return {"time": time.time(), "uptime_seconds": time.time() - m.started_at, "models": models, "overhead_seconds": overhead}


def _scheduler(m: GatewayMetrics, backend: Backend) -> dict[str, Any]:
    """The scheduler's view of a model: its policy, who waits by tier, refusals by reason, waits by tier."""
    mid = backend.model_id
    wait = {tier: {"sum": _samples(m.tier_queue_wait, "enginegate_scheduler_queue_wait_seconds_sum", model=mid, service_tier=tier),
                   "count": _samples(m.tier_queue_wait, "enginegate_scheduler_queue_wait_seconds_count", model=mid, service_tier=tier)}
            for tier in TIERS}
    return {
        "policy": backend.replicas[0].admission.policy.policy if backend.replicas else "fair",
        "waiting": refresh_tiers(m, backend),
        "refusals": {reason: _samples(m.refusals, "enginegate_scheduler_refusals_total", model=mid, reason=reason)
                     for reason in REFUSAL_REASONS},
        "preempts": backend.preempts,
        "preemptions": _samples(m.preemptions, "enginegate_scheduler_preemptions_total", model=mid),
        "queue_wait_seconds": wait,
    }


def _speculation(m: GatewayMetrics, model: str, engine: str) -> dict[str, float] | None:
    """The engine's drafted and accepted token counters (as last polled), or None when it never drafted."""
    drafted = _samples(m.engine_gauges["draft_tokens_total"], "enginegate_engine_draft_tokens", model=model, engine=engine)
    if not drafted:
        return None
    accepted = _samples(m.engine_gauges["draft_accepted_tokens_total"], "enginegate_engine_draft_accepted_tokens",
                        model=model, engine=engine)
    return {"drafted": drafted, "accepted": accepted, "acceptance": accepted / drafted}


def _lifecycle(view: dict[str, Any]) -> dict[str, Any]:
    return {k: view[k] for k in ("state", "reason", "fallbacks", "pinned") if k in view}


@router.get("/v1/gateway/stats")
async def gateway_stats(request: Request) -> dict[str, Any]:
    m = metrics(request)
    rt = runtime(request)
    ready = await refresh(m, rt, epp=request.app.state.settings.epp_metrics)
    return summarize(m, rt, ready)
