"""What the tracing settings amount to: a pure function of the config section and the environment."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.tracing.config import Protocol, TracingConfig
from gateway.tracing.sampling import SamplerError, SamplerSpec, sampler_spec

DEFAULT_SERVICE = "enginegate"
ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
PROTOCOL_VARS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
CAPTURE_VAR = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"


@dataclass(frozen=True, slots=True)
class TracingPlan:
    on: bool
    why: str
    """One line for the log: what turned it on or left it off."""
    endpoint: str | None = None
    """The traces URL as the exporter takes it (http/protobuf: ending in /v1/traces)."""
    protocol: Protocol = "http/protobuf"
    service_name: str = DEFAULT_SERVICE
    sampler: SamplerSpec = field(default_factory=lambda: SamplerSpec("always_on"))
    capture_content: bool = False


def _first(environ: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    for name in names:
        value = environ.get(name, "").strip()
        if value:
            return name, value
    return None


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def traces_url(endpoint: str, protocol: Protocol, signal_specific: bool) -> str:
    """OTLP/HTTP appends /v1/traces to the generic endpoint, never to the traces-specific one (the spec)."""
    if protocol == "grpc" or signal_specific:
        return endpoint
    return endpoint.rstrip("/") + "/v1/traces"


def tracing_plan(config: TracingConfig, environ: Mapping[str, str]) -> TracingPlan:
    """Raises `SamplerError` (a ValueError) for a sampler or protocol it cannot read."""
    if config.endpoint:
        endpoint, specific, source = config.endpoint, False, "tracing.endpoint"
    else:
        found = _first(environ, ENDPOINT_VARS)
        endpoint, specific, source = (found[1], found[0] == ENDPOINT_VARS[0], found[0]) if found else (None, False, "")
    if config.enabled is False:
        return TracingPlan(False, "tracing.enabled is false")
    if config.enabled is None:
        if _truthy(environ.get("OTEL_SDK_DISABLED")):
            return TracingPlan(False, "OTEL_SDK_DISABLED=true")
        if endpoint is None:
            return TracingPlan(False, "no OTLP endpoint set (OTEL_EXPORTER_OTLP_ENDPOINT or tracing.endpoint)")
    protocol_var = _first(environ, PROTOCOL_VARS)
    protocol = config.protocol or (protocol_var[1] if protocol_var else "http/protobuf")
    if protocol not in ("http/protobuf", "grpc"):
        raise SamplerError(f"{protocol_var[0] if protocol_var else 'tracing.protocol'} {protocol!r}: "
                         "enginegate exports over http/protobuf or grpc")
    if endpoint is None:  # enabled: true with no endpoint anywhere: the SDK's default receiver
        endpoint, specific, source = ("http://localhost:4317" if protocol == "grpc" else "http://localhost:4318"), False, "default"
    sampler = sampler_spec(config.sampler or environ.get("OTEL_TRACES_SAMPLER"),
                           config.sampler_arg if config.sampler_arg is not None else environ.get("OTEL_TRACES_SAMPLER_ARG"))
    capture = config.capture_content if config.capture_content is not None else _truthy(environ.get(CAPTURE_VAR))
    service = config.service_name or environ.get("OTEL_SERVICE_NAME", "").strip() or DEFAULT_SERVICE
    url = traces_url(endpoint, protocol, specific)  # type: ignore[arg-type]
    return TracingPlan(True, f"exporting to {url} over {protocol} ({source})", url, protocol,  # type: ignore[arg-type]
                       service, sampler, capture)
