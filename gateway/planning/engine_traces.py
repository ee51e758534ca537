"""Whether the engine exports spans of its own into the gateway's traces (a pure decision).

When the gateway traces and the engine traces itself (`EngineSpec.traces`: vLLM, SGLang), the plan
sends the engine's spans to the gateway's own OTLP endpoint, so they land in the same trace under
the gateway's attempt span (the gateway sends `traceparent` to the engine). The user's explicit
`options.engine_traces` / `options.otlp_traces_endpoint` win; the plan says what it did and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from adapters.spec import EngineSpec

if TYPE_CHECKING:
    from gateway.planning.plan import Plan

@dataclass(frozen=True, slots=True)
class TraceTarget:
    """Where the gateway exports its spans (gateway/tracing's plan): the traces URL as an exporter takes
    it (grpc: the endpoint; http/protobuf: ending in /v1/traces) and the protocol, both of which vLLM's
    and SGLang's exporters speak too."""

    endpoint: str
    protocol: str


@dataclass(frozen=True, slots=True)
class EngineTraceDecision:
    options: dict[str, Any]
    reason: str | None = None
    warning: str | None = None


def decide(engine: EngineSpec, target: TraceTarget | None, user: Mapping[str, Any]) -> EngineTraceDecision:
    wanted = user.get("engine_traces")
    if "otlp_traces_endpoint" in user and wanted is not False:
        return EngineTraceDecision({}, f"engine spans: {engine.name} exports to {user['otlp_traces_endpoint']} "
                                       "(options.otlp_traces_endpoint, set in the config)")
    if wanted is False:
        return EngineTraceDecision({}, "engine spans: off (options.engine_traces: false, set in the config)"
                                   if target is not None else None)
    if not engine.traces:
        if wanted:
            return EngineTraceDecision({}, warning=f"options.engine_traces is true, but {engine.name} exports no "
                                                   "spans of its own: traces end at the gateway's attempt span")
        return EngineTraceDecision({})
    if target is None:
        if wanted:
            return EngineTraceDecision({}, warning="options.engine_traces is true, but the gateway has no OTLP "
                                                   "endpoint (OTEL_EXPORTER_OTLP_ENDPOINT) and "
                                                   "options.otlp_traces_endpoint is unset: no engine spans")
        return EngineTraceDecision({})
    how = "set in the config" if wanted else "the gateway traces"
    return EngineTraceDecision(
        {"otlp_traces_endpoint": target.endpoint, "otlp_traces_protocol": target.protocol},
        f"engine spans: {how}, so {engine.name} exports its own request spans to {target.endpoint} "
        f"({target.protocol}), under the gateway's attempt span (options.engine_traces: false turns them off)",
    )


def with_engine_traces(plan: Plan, engine: EngineSpec, target: TraceTarget | None, user: Mapping[str, Any]) -> Plan:
    """The plan with the engine's trace export in its options and its reason (or warning) said."""
    decision = decide(engine, target, user)
    return plan.model_copy(update={
        "options": {**plan.options, **decision.options},
        "reasons": (*plan.reasons, *([decision.reason] if decision.reason else [])),
        "warnings": (*plan.warnings, *([decision.warning] if decision.warning else [])),
    })
