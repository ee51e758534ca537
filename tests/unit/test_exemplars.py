"""Trace-id exemplars on the latency histograms: present in OpenMetrics only, only for sampled spans,
never looked for with tracing off; /metrics keeps the classic text for plain scrapers."""

from __future__ import annotations

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from gateway import exemplars
from gateway.app import create_app
from gateway.config import Settings
from gateway.exemplars import trace_exemplar, wants_openmetrics
from gateway.metrics import GatewayMetrics
from gateway.runtime import runtime_for_adapters
from gateway.tracing import spans, switch
from tests.unit.test_obs_metrics import CHAT, ScriptedAdapter

TRACER = TracerProvider().get_tracer("test")
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")  # what Prometheus 2.x sends


def bucket_exemplars(text: str, name: str) -> list[dict[str, str]]:
    found = []
    for family in openmetrics_families(text):
        for sample in family.samples:
            if sample.name == f"{name}_bucket" and sample.exemplar is not None:
                found.append(sample.exemplar.labels)
    return found


@pytest.mark.parametrize(("accept", "wanted"), [
    (PROMETHEUS_ACCEPT, True),
    ("application/openmetrics-text; version=1.0.0", True),
    ("Application/OpenMetrics-Text", True),
    ("", False),
    ("*/*", False),
    ("text/plain;version=0.0.4", False),
    ("application/openmetrics-text;q=0, text/plain", False),
])
def test_openmetrics_only_when_asked(accept: str, wanted: bool) -> None:
    assert wants_openmetrics(accept) is wanted


def test_exemplar_names_the_sampled_span() -> None:
    assert trace_exemplar() is None  # no span
    with TRACER.start_as_current_span("request") as span:
        ctx = span.get_span_context()
        assert trace_exemplar() == {"trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}"}
    unsampled = TracerProvider(sampler=ALWAYS_OFF).get_tracer("test")
    with unsampled.start_as_current_span("request"):
        assert trace_exemplar() is None  # never exported: a link would lead nowhere


@pytest.fixture
def tracing_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(switch, "ON", True)


@pytest.mark.usefixtures("tracing_on")
def test_latency_histograms_carry_the_trace_in_openmetrics_only() -> None:
    m = GatewayMetrics(gpu=False)
    with TRACER.start_as_current_span("request") as span:
        trace_id = f"{span.get_span_context().trace_id:032x}"
        m.ttft.labels("m1", "llamacpp").observe(0.3)
        m.itl.labels("m1", "llamacpp").observe(0.02)
        m.queue_wait.labels("m1").observe(0.004)
        m.request_duration.labels("/v1/chat/completions", "m1").observe(1.2)
    m.e2e.labels("m1", "llamacpp").observe(1.0)  # outside any span: no exemplar
    om = m.render(openmetrics_format=True).decode()
    for name in ("enginegate_time_to_first_token_seconds", "enginegate_inter_token_latency_seconds",
                 "enginegate_queue_wait_seconds", "enginegate_request_duration_seconds"):
        assert [e["trace_id"] for e in bucket_exemplars(om, name)] == [trace_id], name
    assert bucket_exemplars(om, "enginegate_e2e_request_latency_seconds") == []
    assert om.rstrip().endswith("# EOF")
    classic = m.render().decode()
    assert "trace_id" not in classic and "# EOF" not in classic
    assert list(text_string_to_metric_families(classic))  # still the classic format, parseable


def test_tracing_off_histograms_look_for_no_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail() -> None:
        raise AssertionError("an observation looked for a trace with tracing off")

    monkeypatch.setattr(exemplars, "_current_span", fail)
    assert switch.ON is False
    m = GatewayMetrics(gpu=False)
    with TRACER.start_as_current_span("request"):
        m.ttft.labels("m1", "e").observe(0.3)
        m.request_duration.labels("/v1/chat/completions", "m1").observe(1.0)
        m.queue_wait.labels("m1").observe(0.5)
    assert bucket_exemplars(m.render(openmetrics_format=True).decode(), "enginegate_time_to_first_token_seconds") == []


async def traced_client(monkeypatch: pytest.MonkeyPatch) -> tuple[httpx.AsyncClient, InMemorySpanExporter]:
    """The real app with tracing on as gateway/tracing's configure() leaves it (the switch, the tracer),
    but the tracer exporting to memory: configure()'s SDK set-up is process-wide, tests/integration runs it."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(switch, "ON", True)
    monkeypatch.setattr(spans, "_tracer", provider.get_tracer("enginegate"))
    settings = Settings()
    rt = runtime_for_adapters(settings, {"m1": ScriptedAdapter()})
    rt.started = True
    app = create_app(settings, rt)
    app.state.runtime = rt
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"), exporter


async def test_a_streamed_request_leaves_its_trace_on_ttft_itl_and_duration(monkeypatch: pytest.MonkeyPatch) -> None:
    client, exporter = await traced_client(monkeypatch)
    async with client:
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
        om = await client.get("/metrics", headers={"Accept": PROMETHEUS_ACCEPT})
        plain = await client.get("/metrics")
    assert om.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    assert plain.headers["content-type"].startswith("text/plain; version=0.0.4")
    [trace_id] = {f"{span.context.trace_id:032x}" for span in exporter.get_finished_spans()
                  if span.name.startswith("POST")}  # the server span of the chat
    for name in ("enginegate_time_to_first_token_seconds", "enginegate_inter_token_latency_seconds",
                 "enginegate_queue_wait_seconds", "enginegate_request_duration_seconds"):
        found = bucket_exemplars(om.text, name)
        assert found and all(e["trace_id"] == trace_id for e in found), name
    assert "trace_id" not in plain.text


