"""An engine's own OpenTelemetry request spans, for the engines that trace themselves (vLLM, SGLang).

Options (a model's `options`, or the plan's: gateway/planning/engine_traces.py fills them when the
gateway traces; the config's value wins):

    otlp_traces_endpoint     where the engine exports its spans: a URL (http/protobuf: the full
                             .../v1/traces URL) or host:port (grpc)
    otlp_traces_protocol     grpc (both engines' default) or http/protobuf
    engine_traces            false: no engine spans even where an endpoint is set
    collect_detailed_traces  vLLM only: model, worker or all (its --collect-detailed-traces; costs time per step)

The engine continues the trace from the `traceparent` the gateway sends on each request, so its
spans land under the gateway's attempt span. `OTEL_SERVICE_NAME` is set to the engine's name (the
gateway's own would otherwise be inherited); `options.env` may set another.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from adapters.launch import LaunchConfigError

PROTOCOLS = ("grpc", "http/protobuf")
DETAILED = ("model", "worker", "all")


@dataclass(frozen=True, slots=True)
class EngineTraces:
    endpoint: str
    protocol: str
    detailed: str | None = None

    def env(self, service_name: str) -> dict[str, str]:
        """The exporter's protocol (both engines read the standard variable) and the engine's service name."""
        return {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": self.protocol, "OTEL_SERVICE_NAME": service_name}


def engine_traces(options: Mapping[str, Any]) -> EngineTraces | None:
    """The engine's trace export from its options; None: off. Raises LaunchConfigError naming a bad option."""
    wanted = options.get("engine_traces")
    if wanted is not None and not isinstance(wanted, bool):
        raise LaunchConfigError(f"options.engine_traces must be true or false, got {wanted!r}")
    endpoint = options.get("otlp_traces_endpoint")
    if wanted is False or not endpoint:
        return None
    if not isinstance(endpoint, str) or any(c.isspace() for c in endpoint):
        raise LaunchConfigError(f"options.otlp_traces_endpoint must be a URL or host:port, got {endpoint!r}")
    protocol = options.get("otlp_traces_protocol") or "grpc"
    if protocol not in PROTOCOLS:
        raise LaunchConfigError(f"options.otlp_traces_protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    detailed = options.get("collect_detailed_traces")
    if detailed is not None and (not isinstance(detailed, str) or not set(detailed.split(",")) <= set(DETAILED)):
        raise LaunchConfigError(f"options.collect_detailed_traces must be a comma list of {', '.join(DETAILED)}, "
                                f"got {detailed!r}")
    return EngineTraces(endpoint=endpoint, protocol=str(protocol), detailed=detailed)


def vllm_trace_args(traces: EngineTraces | None) -> list[str]:
    if traces is None:
        return []
    argv = ["--otlp-traces-endpoint", traces.endpoint]
    if traces.detailed:
        argv += ["--collect-detailed-traces", traces.detailed]
    return argv


def sglang_trace_args(traces: EngineTraces | None) -> list[str]:
    """SGLang 0.5's spelling (its releases before 0.5 spelled the endpoint flag --oltp-traces-endpoint)."""
    if traces is None:
        return []
    return ["--enable-trace", "--otlp-traces-endpoint", traces.endpoint]
