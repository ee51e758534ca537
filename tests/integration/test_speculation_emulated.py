"""The plan's speculation for a GPU engine, end to end against vLLM's emulator: the planned
`--speculative-config` is what the emulated vLLM runs with, and its spec_decode counters come back
as enginegate's acceptance rate."""

from __future__ import annotations

import httpx
import pytest

from adapters.launch import launch_options
from adapters.prom import engine_stats
from adapters.vllm import METRICS, engine_args
from gateway.metrics import GatewayMetrics, acceptance_ratio
from gateway.planning import Workload, plan
from tests.emulators.fixture import running_emulator
from tests.unit.hosts import host
from tests.unit.planning.test_plan_scenarios import ALL, model

pytestmark = pytest.mark.integration
EDIT = Workload(prompt_tokens=400, output_tokens=400, output_copies_prompt=True)
CHAT = {"model": "emulated-model", "messages": [{"role": "user", "content": "fix: teh cat"}], "max_tokens": 9}


def planned_flag() -> str:
    p = plan(host("hgx-8x-h100"), model("llama-3-70b"), EDIT, installed=ALL)
    assert p.engine == "vllm"
    argv = engine_args("/models/llama-3-70b", "m", launch_options(p.options))
    return argv[argv.index("--speculative-config") + 1]


def test_planned_speculation_runs_on_the_emulated_vllm_and_its_acceptance_comes_back() -> None:
    with running_emulator("vllm", "--speculative-config", planned_flag(), "--tokens", "9") as emu:
        assert httpx.post(emu.url + "/v1/chat/completions", json=CHAT, timeout=30).status_code == 200
        stats = engine_stats(httpx.get(emu.url + "/metrics", timeout=10).text, METRICS)
    # 9 tokens: 4 verification steps of 4 drafted tokens (the plan's num_speculative_tokens), one accepted each
    assert (stats.draft_tokens_total, stats.draft_accepted_tokens_total) == (16, 4)
    m = GatewayMetrics(gpu=False)
    m.set_engine_stats("m", "vllm", stats)
    assert acceptance_ratio(stats) == 0.25
    assert 'enginegate_engine_draft_acceptance_ratio{engine="vllm",model="m"} 0.25' in m.render().decode()


def test_without_speculation_vllm_reports_no_draft_counters() -> None:
    with running_emulator("vllm", "--tokens", "9") as emu:
        httpx.post(emu.url + "/v1/chat/completions", json=CHAT, timeout=30)
        text = httpx.get(emu.url + "/metrics", timeout=10).text
    assert "spec_decode" not in text and acceptance_ratio(engine_stats(text, METRICS)) is None
