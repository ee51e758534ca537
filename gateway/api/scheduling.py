"""The scheduler's side of the request flow: a request's demand, what its refusals answer, what
the engine is told of its class (never more than its key allows), and the per-tier metrics."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request

from adapters.server import ServerAdapter
from gateway.api.errors import APIError
from gateway.identity import Caller, ServiceTier, caller_of
from gateway.metrics import GatewayMetrics
from gateway.request_view import RequestView
from gateway.routing import Backend, DeadlineExceeded, Lease, Refusal
from gateway.scheduling import RANK, TIERS, Demand
from gateway.scheduling.classify import DemandError, ceiling_of, demand_for


def request_demand(request: Request, body: dict[str, Any], view: RequestView | None = None) -> Demand:
    """400 naming the header when a scheduling header is unreadable."""
    client = request.client.host if request.client is not None else None
    try:
        return demand_for(body, request.headers, caller_of(request.scope), client,
                          request.app.state.settings.flows, asyncio.get_running_loop().time(), view)
    except DemandError as exc:
        raise APIError(400, str(exc), param=exc.header, code="invalid_header") from exc


def refused(m: GatewayMetrics, backend: Backend, exc: Refusal | DeadlineExceeded, retry_after: int) -> APIError:
    """A scheduler refusal as the API's error: 429 to the sender (queue bounds), 504 (deadline)."""
    if isinstance(exc, DeadlineExceeded):
        m.refusals.labels(backend.model_id, "deadline").inc()
        return APIError(504, f"model `{backend.model_id}`: {exc}", code="deadline_exceeded")
    m.refusals.labels(backend.model_id, exc.reason).inc()
    m.rejected.labels(backend.model_id).inc()
    return APIError(429, f"model `{backend.model_id}` is busy: {exc}", code="queue_full",
                    headers={"Retry-After": str(retry_after)})


def observe_wait(m: GatewayMetrics, backend: Backend, demand: Demand | None, waited: float) -> None:
    m.tier_queue_wait.labels(backend.model_id, demand.tier if demand is not None else "default").observe(waited)


def within_ceiling(body: dict[str, Any], demand: Demand, caller: Caller | None) -> dict[str, Any]:
    """What the engine is told of the request's class never exceeds what its key allows. With keys, a body
    `service_tier` above the key's ceiling (or one the gateway does not know, such as `auto`) becomes the
    tier the request is served at, so an upstream that honours the field (OpenAI) serves and reports that
    one; and a `priority` of the client's own is dropped unless the key may use `priority` (what the number
    means is each engine's business; `with_engine_priority` sets it from the tier where the gateway knows).
    Without keys the body goes as it came."""
    ceiling = ceiling_of(caller)
    if ceiling is None or ceiling == "priority":
        return body
    out = body
    asked = body.get("service_tier")
    if isinstance(asked, str) and not (asked in TIERS and RANK[asked] >= RANK[ceiling]):  # type: ignore[index]
        out = {**out, "service_tier": demand.tier}
    if "priority" in out:
        out = {k: v for k, v in out.items() if k != "priority"}
    return out


def engine_priority(sent: object, tier: ServiceTier) -> int:
    """vLLM's `priority` (lower goes first) for a request of `tier`: the client's own value when it is an
    integer that ranks it no higher than its tier (priority 0, default 1, flex 2), else the tier's."""
    floor = RANK[tier]
    return sent if type(sent) is int and sent >= floor else floor


def with_engine_priority(body: dict[str, Any], lease: Lease, demand: Demand | None) -> dict[str, Any]:
    """The request's tier as the engine's `priority` when the engine runs with its spec's `priority_options`
    (vLLM: `--scheduling-policy priority`, set by the plan for a workload with priority classes, or by the
    user); a `priority` the client sent itself is kept only where it ranks the request no higher (`engine_priority`)."""
    adapter = lease.adapter
    if demand is None or not isinstance(adapter, ServerAdapter):
        return body
    wanted = adapter.spec.priority_options  # the adapter's own spec: a plugin engine need not be registered
    if not wanted or any(adapter.options.get(k) != v for k, v in wanted.items()):
        return body
    return {**body, "priority": engine_priority(body.get("priority"), demand.tier)}


def refresh_tiers(m: GatewayMetrics, backend: Backend) -> dict[str, int]:
    """Set the per-tier queue gauges; returns the counts (for the stats and the status page)."""
    counts = dict.fromkeys(TIERS, 0)
    for replica in backend.replicas:
        for tier, n in replica.admission.waiting_by_tier().items():
            counts[tier] += n
    for tier, n in counts.items():
        m.tier_waiting.labels(backend.model_id, tier).set(n)
    return counts
