"""The spans a request makes, through the real app (fake adapter) into the SDK's in-memory exporter:
kinds (the Phoenix receiver of the integration tests keeps none), content capture, and nothing made when off."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from gateway import tracing
from gateway.app import create_app
from gateway.config import Settings
from gateway.runtime import runtime_for_adapters
from gateway.tracing import setup, spans, switch
from tests.fakes import EchoAdapter

CHAT = {"model": "echo", "messages": [{"role": "user", "content": "one two three"}], "max_tokens": 5}
CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans.use(provider.get_tracer("test"))
    switch.ON = True
    try:
        yield exporter
    finally:
        switch.ON = switch.CAPTURE_CONTENT = False
        spans.use(None)  # type: ignore[arg-type]


def client() -> TestClient:
    s = Settings()
    return TestClient(create_app(s, runtime_for_adapters(s, {"echo": EchoAdapter()})))


def test_kinds_parents_and_the_callers_trace(exported: InMemorySpanExporter) -> None:
    with client() as http:
        r = http.post("/v1/chat/completions", json=CHAT, headers={"traceparent": CALLER})
    assert r.status_code == 200
    got = {s.name: s for s in exported.get_finished_spans()}
    server, attempt = got["POST /v1/chat/completions"], got["chat echo"]
    assert server.kind is SpanKind.SERVER and attempt.kind is SpanKind.CLIENT
    assert format(server.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    assert server.parent is not None and format(server.parent.span_id, "016x") == "b7ad6b7169203331"
    for name in ("enginegate.limits", "enginegate.queue", "enginegate.route", "chat echo"):
        assert got[name].parent is not None and got[name].parent.span_id == server.context.span_id, name
    assert attempt.attributes["gen_ai.usage.input_tokens"] == r.json()["usage"]["prompt_tokens"]
    assert "gen_ai.input.messages" not in attempt.attributes


def test_content_only_with_the_opt_in(exported: InMemorySpanExporter) -> None:
    switch.CAPTURE_CONTENT = True
    with client() as http:
        assert http.post("/v1/chat/completions", json=CHAT).status_code == 200
    (attempt,) = [s for s in exported.get_finished_spans() if s.name == "chat echo"]
    assert "one two three" in str(attempt.attributes["gen_ai.input.messages"])
    assert "gen_ai.output.messages" in attempt.attributes


def test_a_stream_ends_its_attempt_with_the_first_token_event(exported: InMemorySpanExporter) -> None:
    with client() as http:
        r = http.post("/v1/chat/completions", json={**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
    (attempt,) = [s for s in exported.get_finished_spans() if s.name == "chat echo"]
    assert [e.name for e in attempt.events] == ["gen_ai.first_token"]
    assert attempt.attributes["gen_ai.usage.output_tokens"] == 3 and attempt.status.status_code is StatusCode.UNSET


def test_off_no_span_is_made_and_no_middleware_added() -> None:
    assert not switch.ON
    spans.use(None)  # type: ignore[arg-type]  # any span helper called now would fail the request
    with client() as http:
        app = http.app
        assert http.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert http.post("/v1/chat/completions", json={**CHAT, "stream": True}).status_code == 200
    assert not any(m.cls.__name__ == "TracingMiddleware" for m in app.user_middleware)  # type: ignore[attr-defined]


def test_asked_for_without_the_sdk_it_says_so_and_serves_untraced(monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(setup, "installed", lambda protocol="http/protobuf": False)
    monkeypatch.setattr(setup, "_status", None)
    with caplog.at_level(logging.WARNING, "enginegate.tracing"):
        status = tracing.configure(tracing.TracingConfig(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert not status.on and not switch.ON
    assert "pip install 'enginegate[otel]'" in status.message and "serving without traces" in caplog.text


class HeaderRecorder(EchoAdapter):
    """Keeps the headers each chat would send to an engine server."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[dict[str, str]] = []

    async def chat(self, body, ctx):  # type: ignore[no-untyped-def]
        self.sent.append(dict(ctx.extra.get("headers", {})))
        return await super().chat(body, ctx)


def test_an_unsampled_request_makes_no_span_and_still_tells_the_engine(exported: InMemorySpanExporter) -> None:
    engine = HeaderRecorder()
    s = Settings()
    unsampled = CALLER[:-2] + "00"  # the caller decided not to sample; the default sampler follows it
    tracer = spans.tracer()
    made: list[str] = []

    class Counting:  # every span asked of the tracer, recording or not
        def start_span(self, name, *args, **kwargs):  # type: ignore[no-untyped-def]
            made.append(name)
            return tracer.start_span(name, *args, **kwargs)

        def start_as_current_span(self, name, *args, **kwargs):  # type: ignore[no-untyped-def]
            made.append(name)
            return tracer.start_as_current_span(name, *args, **kwargs)

    spans.use(Counting())  # type: ignore[arg-type]
    with TestClient(create_app(s, runtime_for_adapters(s, {"echo": engine}))) as http:
        made.clear()  # the start-up's model load
        for stream in (False, True):
            r = http.post("/v1/chat/completions", json={**CHAT, "stream": stream}, headers={"traceparent": unsampled})
            assert r.status_code == 200
        assert made == ["POST", "POST"]  # the server span decides; nothing else is made for an unsampled request
        assert http.post("/v1/chat/completions", json=CHAT, headers={"traceparent": CALLER}).status_code == 200
    names = [s.name for s in exported.get_finished_spans()]
    assert names.count("chat echo") == 1 and names.count("POST /v1/chat/completions") == 1  # the sampled one only
    parents = [h["traceparent"] for h in engine.sent]
    assert [p.split("-")[1] for p in parents] == ["0af7651916cd43dd8448eb211c80319c"] * 3
    assert [p.split("-")[3] for p in parents] == ["00", "00", "01"]  # the engine follows each decision
