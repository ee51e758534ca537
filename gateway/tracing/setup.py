"""Side effects in one place: the OpenTelemetry SDK's tracer provider, exporter and sampler, made once
per process from a `TracingPlan`, and flushed at shutdown. Without the `enginegate[otel]` extra the
gateway runs untraced and says so."""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.tracing import spans, switch
from gateway.tracing.config import TracingConfig
from gateway.tracing.plan import TracingPlan, tracing_plan
from gateway.tracing.sampling import SamplerSpec

log = logging.getLogger("enginegate.tracing")
NOT_INSTALLED = ("tracing was asked for ({why}) but the OpenTelemetry SDK is not installed: "
                 "pip install 'enginegate[otel]'; serving without traces")


@dataclass(frozen=True, slots=True)
class TracingStatus:
    on: bool
    message: str


_provider: Any = None
_status: TracingStatus | None = None


def installed(protocol: str = "http/protobuf") -> bool:
    exporter = ("opentelemetry.exporter.otlp.proto.grpc" if protocol == "grpc"
                else "opentelemetry.exporter.otlp.proto.http")
    try:
        return importlib.util.find_spec("opentelemetry.sdk") is not None and importlib.util.find_spec(exporter) is not None
    except ModuleNotFoundError:
        return False


def _sampler(spec: SamplerSpec) -> Any:
    from opentelemetry.sdk.trace import sampling

    inner = {"always_on": sampling.ALWAYS_ON, "always_off": sampling.ALWAYS_OFF}.get(spec.kind) \
        or sampling.TraceIdRatioBased(spec.ratio)
    return sampling.ParentBased(inner) if spec.parent_based else inner


def _exporter(plan: TracingPlan) -> Any:
    if plan.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter(endpoint=plan.endpoint)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=plan.endpoint)


def configure(config: TracingConfig, environ: Mapping[str, str] | None = None) -> TracingStatus:
    """Turn tracing on (once per process: a second gateway app in the same process shares the first
    one's provider) or leave it off; logs what it did. Never raises for a missing SDK."""
    global _provider, _status
    if _status is not None and _status.on:
        return _status
    plan = tracing_plan(config, os.environ if environ is None else environ)
    if not plan.on:
        _status = TracingStatus(False, f"tracing off: {plan.why}")
        return _status
    if not installed(plan.protocol):
        extra = " and opentelemetry-exporter-otlp-proto-grpc" if plan.protocol == "grpc" else ""
        _status = TracingStatus(False, NOT_INSTALLED.format(why=plan.why) + (f" (grpc needs{extra})" if extra else ""))
        log.warning("%s", _status.message)
        return _status
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": plan.service_name}),
                              sampler=_sampler(plan.sampler), span_limits=_span_limits())
    provider.add_span_processor(BatchSpanProcessor(_exporter(plan)))
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(provider)  # libraries that trace themselves join the same traces
    _provider = provider
    spans.use(provider.get_tracer("enginegate"))
    switch.CAPTURE_CONTENT = plan.capture_content
    switch.ON = True
    _status = TracingStatus(True, f"tracing on: {plan.why}, sampler {plan.sampler.kind}"
                                  f"{f' {plan.sampler.ratio:g}' if plan.sampler.kind == 'traceidratio' else ''}")
    log.info("%s", _status.message)
    return _status


def flush(timeout_seconds: float = 5.0) -> None:
    """Export what is buffered (at shutdown); a receiver that is down costs at most the timeout."""
    if _provider is not None:
        _provider.force_flush(int(timeout_seconds * 1000))


ATTRIBUTE_CHARS = 16384
"""The longest attribute value exported unless OTEL_(SPAN_)ATTRIBUTE_VALUE_LENGTH_LIMIT says otherwise: a
client's 8 MiB prompt (with the content opt-in) would make the collector refuse the whole batch, other
tenants' spans with it."""


def _span_limits() -> Any:
    from opentelemetry.sdk.trace import SpanLimits

    if any(os.environ.get(v) for v in ("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT")):
        return SpanLimits()  # the standard variables, read by the SDK
    return SpanLimits(max_attribute_length=ATTRIBUTE_CHARS)
