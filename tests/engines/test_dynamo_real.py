"""Opt-in (pytest -m real_engine): the real Dynamo frontend + `mocker` worker, started by the adapter.

Runs on a CPU without etcd or NATS (file discovery, TCP request plane, ZMQ events). `ai-dynamo`
pins pydantic <= 2.13.5, so it usually lives in a virtualenv of its own: point DYNAMO_PYTHON at
that interpreter. Install recipe (the plain `pip install ai-dynamo` fails offline, one dependency
downloads from outside the package registries):

    python -m venv /path/dynamo && /path/dynamo/bin/pip install ai-dynamo-runtime==1.6.1
    /path/dynamo/bin/pip install --no-deps ai-dynamo==1.6.1
    /path/dynamo/bin/pip install msgspec pyzmq 'redis>=6.2,<9' zstandard tqdm 'transformers>=4.56' \\
        'prometheus-client>=0.23.1,<1' 'aiohttp>=3.14.3,<4' certifi typing-extensions
    DYNAMO_PYTHON=/path/dynamo/bin/python pytest -m real_engine tests/engines/test_dynamo_real.py

The mocker emits random token ids, so it tests protocol, usage counts and metrics, not text.
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

from adapters.dynamo import DynamoAdapter
from gateway.config import ModelConfig, Settings
from gateway.runtime import Runtime
from tests.engines.harness import running_gateway
from tests.engines.tiny_model import build_tiny_llama

pytestmark = pytest.mark.real_engine
SERVED = "tiny-dynamo"


def dynamo_python() -> str:
    configured = os.environ.get("DYNAMO_PYTHON")
    if configured:
        if not Path(configured).is_file():
            pytest.skip(f"DYNAMO_PYTHON={configured} does not exist")
        probe = subprocess.run([configured, "-c", "import dynamo.frontend, dynamo.mocker"], capture_output=True)
        if probe.returncode != 0:
            pytest.skip(f"DYNAMO_PYTHON={configured} cannot import dynamo: {probe.stderr.decode()[-300:]}")
        return configured
    if importlib.util.find_spec("dynamo") is None:
        pytest.skip("ai-dynamo is not installed here and DYNAMO_PYTHON is not set (install recipe in this file's docstring)")
    return sys.executable


def test_frontend_with_mocker_through_the_gateway(tmp_path: Path) -> None:
    python = dynamo_python()
    model = build_tiny_llama(tmp_path / "tiny")
    options = {"worker": "mocker", "python": python, "log_dir": str(tmp_path / "logs")}
    settings = Settings(models=(ModelConfig(source=str(model), name=SERVED, engine="dynamo", options=options),))
    runtime = Runtime.build(settings)
    adapter = next(iter(runtime.models)).adapter
    assert isinstance(adapter, DynamoAdapter)
    with running_gateway(settings, runtime) as base_url:
        pids = [adapter.process.pid, adapter.worker_process.pid]
        client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
        whole = client.chat.completions.create(model=SERVED, messages=[{"role": "user", "content": "hello there"}],
                                               max_tokens=6)
        assert whole.usage is not None and whole.usage.completion_tokens == 6 and whole.usage.prompt_tokens > 0
        assert whole.choices[0].finish_reason == "length"
        chunks = list(client.chat.completions.create(
            model=SERVED, messages=[{"role": "user", "content": "hello"}], max_tokens=4, stream=True,
            stream_options={"include_usage": True}))
        assert chunks[0].choices[0].delta.role == "assistant"
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
        text = client.completions.create(model=SERVED, prompt="hello there", max_tokens=3)
        assert text.usage is not None and text.usage.completion_tokens == 3
        metrics = httpx.get(base_url.removesuffix("/v1") + "/metrics").text
        labels = f'{{engine="dynamo",model="{SERVED}"}}'
        generated = [float(r.split()[-1]) for r in metrics.splitlines() if r.startswith("enginegate_engine_generation_tokens" + labels)]
        prompt = [float(r.split()[-1]) for r in metrics.splitlines() if r.startswith("enginegate_engine_prompt_tokens" + labels)]
        assert generated == [13.0]
        assert prompt and prompt[0] >= 2
    for pid in pids:
        assert pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
