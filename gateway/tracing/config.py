"""The `tracing:` section of the config. The standard OTEL_* environment configures the SDK; a field
set here overrides its variable (the user's explicit config wins), a field left unset leaves it to the
environment, and the environment left unset leaves the SDK's own default."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Protocol = Literal["http/protobuf", "grpc"]


class TracingConfig(BaseModel):
    """OpenTelemetry traces of each request (docs/tracing.md); needs the `enginegate[otel]` extra."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    enabled: bool | None = None
    """None: on when OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set and
    OTEL_SDK_DISABLED is not `true`; true or false: as said, whatever the environment holds."""
    endpoint: str | None = None
    """The OTLP receiver, e.g. http://localhost:4318 (http/protobuf: /v1/traces is added) or
    http://localhost:4317 (grpc); overrides OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT."""
    protocol: Protocol | None = None
    """Overrides OTEL_EXPORTER_OTLP_TRACES_PROTOCOL / OTEL_EXPORTER_OTLP_PROTOCOL (default http/protobuf;
    grpc needs opentelemetry-exporter-otlp-proto-grpc installed)."""
    service_name: str | None = None
    """Overrides OTEL_SERVICE_NAME (default `enginegate`)."""
    sampler: str | None = None
    """Overrides OTEL_TRACES_SAMPLER: always_on, always_off, traceidratio, parentbased_always_on (the
    default), parentbased_always_off, parentbased_traceidratio."""
    sampler_arg: float | None = Field(default=None, ge=0.0, le=1.0)
    """Overrides OTEL_TRACES_SAMPLER_ARG: the ratio of the traceidratio samplers (default 1.0)."""
    capture_content: bool | None = None
    """Prompt and completion text on the engine attempt spans; overrides
    OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT (default false: never)."""
