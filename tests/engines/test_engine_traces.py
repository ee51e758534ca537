"""The engines that trace themselves (vLLM, SGLang): the flags and environment their own span export
takes, and the plan's decision to turn it on with the gateway's endpoint (the user's setting wins)."""

from __future__ import annotations

from typing import Any

import pytest

from adapters import registry
from adapters.base import EngineError
from adapters.config import EngineConfig
from adapters.engine_traces import EngineTraces, engine_traces
from adapters.launch import LaunchConfigError
from adapters.process import Endpoint
from gateway.config import Settings
from gateway.planning import Plan
from gateway.planning.engine_traces import TraceTarget, decide, with_engine_traces
from gateway.runtime import trace_target
from gateway.tracing import TracingConfig

EP = Endpoint("127.0.0.1", 9000, "KEY")
MODEL = "/models/llama"
HTTP = TraceTarget("http://jaeger:4318/v1/traces", "http/protobuf")
GRPC = TraceTarget("http://jaeger:4317", "grpc")


def launch(engine: str, options: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    adapter = registry.create(engine, EngineConfig(source=MODEL, name="llama", options={"python": "/venv/bin/python", **options}))
    try:
        if adapter.config_error is not None:  # type: ignore[attr-defined]  # what check() raises, engine installed or not
            raise EngineError(adapter.config_error, 503, "invalid_engine_options")  # type: ignore[attr-defined]
        done = adapter.launch(EP)  # type: ignore[attr-defined]
        return done.argv, done.env
    finally:
        adapter.remove_run_dir()  # type: ignore[attr-defined]


def after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_vllm_exports_its_spans_with_the_protocol_and_its_own_service_name() -> None:
    argv, env = launch("vllm", {"otlp_traces_endpoint": HTTP.endpoint, "otlp_traces_protocol": HTTP.protocol})
    assert after(argv, "--otlp-traces-endpoint") == "http://jaeger:4318/v1/traces"
    assert "--collect-detailed-traces" not in argv  # costs time per engine step: only when asked
    assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf" and env["OTEL_SERVICE_NAME"] == "vllm"
    assert env["VLLM_API_KEY"] == "KEY"  # the key still travels in the environment


def test_vllm_detailed_traces_and_grpc_by_default() -> None:
    argv, env = launch("vllm", {"otlp_traces_endpoint": "http://jaeger:4317", "collect_detailed_traces": "model,worker"})
    assert after(argv, "--collect-detailed-traces") == "model,worker"
    assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "grpc"  # vLLM's and SGLang's own default


def test_sglang_spelling() -> None:
    argv, env = launch("sglang", {"otlp_traces_endpoint": "jaeger:4317"})
    assert "--enable-trace" in argv and after(argv, "--otlp-traces-endpoint") == "jaeger:4317"
    assert env == {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc", "OTEL_SERVICE_NAME": "sglang"}


def test_the_users_env_names_the_service_over_the_engine_default() -> None:
    _, env = launch("vllm", {"otlp_traces_endpoint": "http://x:4317", "env": {"OTEL_SERVICE_NAME": "vllm-blue"}})
    assert env["OTEL_SERVICE_NAME"] == "vllm-blue"


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_no_endpoint_or_engine_traces_false_means_no_flags(engine: str) -> None:
    for options in ({}, {"otlp_traces_endpoint": "http://x:4317", "engine_traces": False}):
        argv, env = launch(engine, options)
        assert "--otlp-traces-endpoint" not in argv and "--enable-trace" not in argv
        assert "OTEL_SERVICE_NAME" not in env


@pytest.mark.parametrize(("options", "message"), [
    ({"engine_traces": "yes", "otlp_traces_endpoint": "http://x"}, "options.engine_traces must be true or false"),
    ({"otlp_traces_endpoint": "http://x", "otlp_traces_protocol": "http/json"}, "options.otlp_traces_protocol"),
    ({"otlp_traces_endpoint": "http://x y"}, "options.otlp_traces_endpoint"),
    ({"otlp_traces_endpoint": "http://x", "collect_detailed_traces": "everything"}, "options.collect_detailed_traces"),
])
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_bad_trace_options_name_the_option(engine: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(EngineError) as err:
        launch(engine, options)
    assert message in str(err.value)
    with pytest.raises(LaunchConfigError):
        engine_traces(options)


def test_engine_traces_reads_the_options() -> None:
    assert engine_traces({"otlp_traces_endpoint": "http://x:4317"}) == EngineTraces("http://x:4317", "grpc")
    assert engine_traces({"engine_traces": True}) is None  # nowhere to send them


# -- the plan's decision ------------------------------------------------------------------

VLLM, SGLANG, LLAMACPP = registry.spec("vllm"), registry.spec("sglang"), registry.spec("llamacpp")


@pytest.mark.parametrize(("engine", "target", "user", "options", "said"), [
    # gateway traces, engine traces itself: on, with the gateway's endpoint and protocol
    (VLLM, HTTP, {}, {"otlp_traces_endpoint": HTTP.endpoint, "otlp_traces_protocol": "http/protobuf"}, "the gateway traces"),
    (SGLANG, GRPC, {}, {"otlp_traces_endpoint": GRPC.endpoint, "otlp_traces_protocol": "grpc"}, "the gateway traces"),
    # the user turned it off: nothing, and the plan says it was the config
    (VLLM, HTTP, {"engine_traces": False}, {}, "off (options.engine_traces: false, set in the config)"),
    # the user's own endpoint wins over the gateway's
    (VLLM, HTTP, {"otlp_traces_endpoint": "http://other:4317"}, {}, "exports to http://other:4317"),
    # gateway not tracing: nothing, and nothing said
    (VLLM, None, {}, {}, None),
    # an engine that does not trace itself: nothing
    (LLAMACPP, HTTP, {}, {}, None),
])
def test_decision_table(engine: Any, target: TraceTarget | None, user: dict[str, Any],
                        options: dict[str, Any], said: str | None) -> None:
    decision = decide(engine, target, user)
    assert decision.options == options
    assert decision.warning is None
    if said is None:
        assert decision.reason is None
    else:
        assert decision.reason is not None and said in decision.reason


@pytest.mark.parametrize(("engine", "target", "warned"), [
    (LLAMACPP, HTTP, "llamacpp exports no spans of its own"),
    (VLLM, None, "the gateway has no OTLP endpoint"),
])
def test_asked_for_but_impossible_is_warned(engine: Any, target: TraceTarget | None, warned: str) -> None:
    decision = decide(engine, target, {"engine_traces": True})
    assert decision.options == {} and decision.warning is not None and warned in decision.warning


def test_the_plan_carries_the_options_and_says_why() -> None:
    plan = Plan(engine="vllm", options={"context_length": 4096}, reasons=("gpu: vllm",))
    traced = with_engine_traces(plan, VLLM, HTTP, {})
    assert traced.options == {"context_length": 4096, "otlp_traces_endpoint": HTTP.endpoint,
                              "otlp_traces_protocol": "http/protobuf"}
    assert traced.reasons[0] == "gpu: vllm" and "vllm exports its own request spans" in traced.reasons[-1]
    assert with_engine_traces(plan, VLLM, None, {}) == plan


# -- the runtime's target: the gateway's own tracing plan ------------------------------------

@pytest.mark.parametrize(("env", "config", "target"), [
    ({}, {}, None),  # the gateway does not trace: no engine target
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger:4318"}, {}, TraceTarget("http://jaeger:4318/v1/traces", "http/protobuf")),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, {},
     TraceTarget("http://jaeger:4317", "grpc")),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger:4318", "OTEL_SDK_DISABLED": "true"}, {}, None),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger:4318"}, {"enabled": False}, None),
    ({}, {"endpoint": "http://tempo:4318"}, TraceTarget("http://tempo:4318/v1/traces", "http/protobuf")),
])
def test_trace_target_follows_the_gateways_tracing(env: dict[str, str], config: dict[str, Any],
                                                   target: TraceTarget | None, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
                 "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert trace_target(Settings(tracing=TracingConfig(**config))) == target
