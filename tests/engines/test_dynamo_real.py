"""The real Dynamo frontend + `mocker` worker behind `enginegate serve`, driven by the official openai client.

Runs on a CPU without etcd or NATS (file discovery, TCP request plane, ZMQ events). `ai-dynamo`
pins pydantic <= 2.13.5, so it lives in a virtualenv of its own: `scripts/engine_venvs.sh dynamo`
makes and caches it (the plain `pip install ai-dynamo` fails offline: one dependency downloads
from outside the package registries; the script lists the dependencies it installs by hand), or
point DYNAMO_PYTHON at an interpreter that has it.

The mocker emits random token ids, so it tests protocol, usage counts and metrics, not text.
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
SERVED = "tiny-dynamo"


def test_frontend_with_mocker_through_enginegate_serve(tmp_path: Path) -> None:
    python = engine_python("DYNAMO_PYTHON", "dynamo", "import dynamo.frontend, dynamo.mocker")
    model = build_tiny_llama(tmp_path / "tiny")
    options = {"worker": "mocker", "python": python, "log_dir": str(tmp_path / "logs")}
    config = {"models": [{"source": str(model), "name": SERVED, "engine": "dynamo", "options": options}]}
    with serving(json.dumps(config), start_timeout=300) as gw:
        commands = [" ".join(p.cmdline()) for p in psutil.Process(gw.process.pid).children()]
        assert any("dynamo.mocker" in c for c in commands), f"the user's worker wins over the plan's: {commands}"
        client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=120)
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
        metrics = gw.metrics()
        labels = f'{{engine="dynamo",model="{SERVED}"}}'
        generated = [float(r.split()[-1]) for r in metrics.splitlines() if r.startswith("enginegate_engine_generation_tokens" + labels)]
        prompt = [float(r.split()[-1]) for r in metrics.splitlines() if r.startswith("enginegate_engine_prompt_tokens" + labels)]
        # 6 + 4 + 3 from the client, plus the one token of the start-up readiness probe (ready means a
        # 1-token request answered; probes that fail while the worker registers generate nothing).
        assert generated == [14.0]
        assert prompt and prompt[0] >= 2
