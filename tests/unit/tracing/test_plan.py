"""The tracing settings as a table: environment, config, and which wins."""

from __future__ import annotations

import pytest

from gateway.tracing import (
    SamplerError,
    SamplerSpec,
    TracingConfig,
    sampler_spec,
    tracing_plan,
)

EP = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}


@pytest.mark.parametrize(("config", "env", "on", "endpoint"), [
    ({}, {}, False, None),
    ({}, EP, True, "http://collector:4318/v1/traces"),
    ({}, {**EP, "OTEL_SDK_DISABLED": "true"}, False, None),
    ({}, {**EP, "OTEL_SDK_DISABLED": "false"}, True, "http://collector:4318/v1/traces"),
    ({"enabled": True}, {**EP, "OTEL_SDK_DISABLED": "true"}, True, "http://collector:4318/v1/traces"),  # config wins
    ({"enabled": False}, EP, False, None),
    ({}, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:4318/custom"}, True, "http://t:4318/custom"),  # as given
    ({}, {**EP, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1/x"}, True, "http://t:1/x"),  # specific first
    ({"endpoint": "http://mine:4318/"}, EP, True, "http://mine:4318/v1/traces"),
    ({"enabled": True}, {}, True, "http://localhost:4318/v1/traces"),  # the SDK's default receiver
    ({"enabled": True, "protocol": "grpc"}, {}, True, "http://localhost:4317"),
    ({}, {**EP, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, True, "http://collector:4318"),  # grpc: no path added
])
def test_on_and_endpoint(config: dict[str, object], env: dict[str, str], on: bool, endpoint: str | None) -> None:
    plan = tracing_plan(TracingConfig.model_validate(config), env)
    assert (plan.on, plan.endpoint) == (on, endpoint), plan.why


@pytest.mark.parametrize(("config", "env", "service", "capture"), [
    ({}, EP, "enginegate", False),
    ({}, {**EP, "OTEL_SERVICE_NAME": "gw-eu", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"}, "gw-eu", True),
    ({"service_name": "mine", "capture_content": False},
     {**EP, "OTEL_SERVICE_NAME": "gw-eu", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"}, "mine", False),
    ({}, {**EP, "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "1"}, "enginegate", False),  # only `true` opts in
])
def test_service_and_content_capture(config: dict[str, object], env: dict[str, str], service: str, capture: bool) -> None:
    plan = tracing_plan(TracingConfig.model_validate(config), env)
    assert (plan.service_name, plan.capture_content) == (service, capture)


def test_an_unknown_protocol_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_PROTOCOL 'http/json'"):
        tracing_plan(TracingConfig(), {**EP, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


@pytest.mark.parametrize(("name", "arg", "spec"), [
    (None, None, SamplerSpec("always_on", 1.0, True)),
    ("always_on", None, SamplerSpec("always_on", 1.0, False)),
    ("ALWAYS_OFF", None, SamplerSpec("always_off", 1.0, False)),
    ("traceidratio", "0.01", SamplerSpec("traceidratio", 0.01, False)),
    ("parentbased_traceidratio", "0.25", SamplerSpec("traceidratio", 0.25, True)),
    ("parentbased_traceidratio", None, SamplerSpec("traceidratio", 1.0, True)),
    ("parentbased_traceidratio", "", SamplerSpec("traceidratio", 1.0, True)),
    ("traceidratio", 0.5, SamplerSpec("traceidratio", 0.5, False)),
    ("parentbased_always_off", "0.3", SamplerSpec("always_off", 1.0, True)),  # the arg is for ratios only
])
def test_sampler_spec(name: str | None, arg: str | float | None, spec: SamplerSpec) -> None:
    assert sampler_spec(name, arg) == spec


@pytest.mark.parametrize(("name", "arg"), [("jaeger_remote", None), ("traceidratio", "half"), ("traceidratio", "1.5"),
                                           ("traceidratio", "-0.1")])
def test_sampler_errors(name: str, arg: str | None) -> None:
    with pytest.raises(SamplerError):
        sampler_spec(name, arg)


def test_the_config_sampler_overrides_the_environment() -> None:
    env = {**EP, "OTEL_TRACES_SAMPLER": "always_off"}
    assert tracing_plan(TracingConfig(), env).sampler.kind == "always_off"
    plan = tracing_plan(TracingConfig(sampler="traceidratio", sampler_arg=0.1), {**env, "OTEL_TRACES_SAMPLER_ARG": "0.9"})
    assert plan.sampler == SamplerSpec("traceidratio", 0.1, False)


def test_serve_refuses_an_unreadable_sampler_in_one_line(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.cli import main
    from gateway.tracing import setup

    monkeypatch.setattr(setup, "_status", None)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "lots")
    assert main(["serve", "--port", "0"]) == 2
    assert "invalid configuration: OTEL_TRACES_SAMPLER_ARG 'lots' is not a number" in capsys.readouterr().err


@pytest.mark.parametrize(("env", "limit"), [
    ({}, 16384),  # a client's huge prompt (content opt-in) cannot make the collector refuse everyone's batch
    ({"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "100"}, 100),  # the standard variables win
    ({"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "50"}, 50),
])
def test_attribute_values_are_bounded(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], limit: int) -> None:
    pytest.importorskip("opentelemetry.sdk.trace")
    from gateway.tracing.setup import _span_limits

    for name in ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert _span_limits().max_span_attribute_length == limit
