"""OpenTelemetry traces of each request (docs/tracing.md): off unless the OTEL_* environment or the
`tracing:` config turns it on, and then only with the `enginegate[otel]` extra installed.

Hot paths test `switch.ON` before touching `spans`; `asgi` (the server span) imports OpenTelemetry
and is imported only when tracing is on."""

from gateway.tracing import switch
from gateway.tracing.config import TracingConfig
from gateway.tracing.plan import TracingPlan, tracing_plan
from gateway.tracing.sampling import SamplerError, SamplerSpec, sampler_spec
from gateway.tracing.setup import TracingStatus, configure, flush, installed

__all__ = [
    "SamplerError",
    "SamplerSpec",
    "TracingConfig",
    "TracingPlan",
    "TracingStatus",
    "configure",
    "flush",
    "installed",
    "sampler_spec",
    "switch",
    "tracing_plan",
]
