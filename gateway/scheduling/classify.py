"""A request's `Demand`, from what the gateway knows before admitting it: its caller (API key), its
headers, its body and its client address. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.config import FlowConfig
from gateway.identity import Caller, ServiceTier
from gateway.request_view import RequestView
from gateway.scheduling.demand import RANK, TIERS, Demand
from gateway.scheduling.prompt import prompt_tokens

DEADLINE_HEADER = "x-enginegate-deadline-ms"
"""Milliseconds from the gateway's receipt of the request by which it must have left the queue
(started on an engine); still waiting then, it is answered 504."""
MAX_FLOW_CHARS = 128
ANONYMOUS = "anonymous"


class DemandError(ValueError):
    """A scheduling header the gateway cannot read (the API answers 400 naming it)."""

    def __init__(self, header: str, message: str) -> None:
        super().__init__(message)
        self.header = header


def asked_tier(body: Mapping[str, Any], headers: Mapping[str, str], flows: FlowConfig) -> ServiceTier | None:
    """The tier the request asks for: the body's `service_tier` (OpenAI's; `auto` and unknown values
    defer), else the tier header; None when it names none."""
    asked = body.get("service_tier")
    if isinstance(asked, str) and asked in TIERS:
        return asked  # type: ignore[return-value]
    header = headers.get(flows.tier_header)
    if header is not None:
        value = header.strip().lower()
        if value not in TIERS:
            raise DemandError(flows.tier_header, f"header {flows.tier_header} must be one of {', '.join(TIERS)}, "
                                                 f"got {header[:32]!r}")
        return value  # type: ignore[return-value]
    return None


def ceiling_of(caller: Caller | None) -> ServiceTier | None:
    """The highest tier the caller may use: its key's `service_tier`, `default` for a key given none (only
    a key explicitly given `priority` may use it); None without keys (any tier may be asked)."""
    if caller is None:
        return None
    return caller.service_tier or "default"


def lower(a: ServiceTier, b: ServiceTier) -> ServiceTier:
    return a if RANK[a] >= RANK[b] else b


def tier_of(body: Mapping[str, Any], headers: Mapping[str, str], caller: Caller | None, flows: FlowConfig) -> ServiceTier:
    """The tier the request is served at: what it asks for (`asked_tier`), else its key's; never above
    its key's ceiling (a request asking more is served at the ceiling, as OpenAI serves an organisation
    asking a tier it lacks)."""
    asked = asked_tier(body, headers, flows)
    ceiling = ceiling_of(caller)
    if ceiling is None:
        return asked or "default"
    return ceiling if asked is None else lower(asked, ceiling)


def deadline_of(headers: Mapping[str, str], now: float) -> float | None:
    raw = headers.get(DEADLINE_HEADER)
    if raw is None:
        return None
    try:
        ms = float(raw)
    except ValueError:
        ms = -1.0
    if not ms > 0 or ms == float("inf"):
        raise DemandError(DEADLINE_HEADER, f"header {DEADLINE_HEADER} must be a positive number of milliseconds, "
                                           f"got {raw[:32]!r}")
    return now + ms / 1000.0


def demand_for(body: Mapping[str, Any], headers: Mapping[str, str], caller: Caller | None, client: str | None,
               flows: FlowConfig, now: float, view: RequestView | None = None) -> Demand:
    """`headers` with lower-case names (Starlette's Headers); `now` on the event loop's clock; `view`: the
    request's prompt view when the caller has one (else it is made from the body)."""
    if caller is not None:
        flow = caller.name
    else:
        flow = (headers.get(flows.header) or "").strip()[:MAX_FLOW_CHARS] or client or ANONYMOUS
    weight = caller.weight if caller is not None and caller.weight != 1.0 else flows.weights.get(flow, 1.0)
    return Demand(flow=flow, tier=tier_of(body, headers, caller, flows), weight=weight,
                  prompt_tokens=prompt_tokens(view if view is not None else body), deadline=deadline_of(headers, now))
