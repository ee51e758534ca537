"""Calibration: the planner's decode bound against llama.cpp's real decode rate on this machine."""

import time

import pytest

from gateway.hardware import detect, measure_memory_bandwidth
from gateway.planning import Workload, installed_set, load_spec, plan
from tests.unit.hosts import embedded_gguf

PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper and the sea."}]


@pytest.mark.real_engine
def test_measured_decode_stays_under_the_predicted_bound() -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    snapshot = detect()
    gbps = measure_memory_bandwidth()
    snapshot = snapshot.model_copy(update={"cpu": snapshot.cpu.model_copy(update={"measured_bandwidth_gbps": gbps})})
    spec = load_spec(embedded_gguf())
    decision = plan(
        snapshot, spec, Workload(prompt_tokens=32, output_tokens=200), installed=installed_set({"llamacpp"})
    )
    assert decision.capacity and decision.capacity.decode_tokens_per_s
    llm = llama_cpp.Llama(
        model_path=str(embedded_gguf()), n_ctx=2048, n_threads=decision.options["threads"], verbose=False
    )
    llm.create_chat_completion(messages=PROMPT, max_tokens=4, temperature=0)
    stamps = []
    for chunk in llm.create_chat_completion(messages=PROMPT, max_tokens=200, temperature=0, stream=True):
        if chunk["choices"][0]["delta"].get("content"):
            stamps.append(time.perf_counter())
    measured = (len(stamps) - 1) / (stamps[-1] - stamps[0])
    predicted = decision.capacity.decode_tokens_per_s
    print(f"copy bandwidth {gbps:.1f} GB/s, predicted bound {predicted:.0f} tok/s, measured {measured:.0f} tok/s")
    assert measured <= predicted  # an upper bound: fixed per-token costs only push the real rate lower
