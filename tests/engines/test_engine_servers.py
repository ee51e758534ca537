"""Each server engine's real adapter, through the real ManagedProcess and relay, against its emulator.

The adapter builds its engine's command line; `options.executable` swaps only the program for
`tests.engines.fake_engine`, which parses that command line with the engine's flag grammar and
becomes the engine emulator in that engine's style. Requests go through the gateway (uvicorn,
the real app) with the official openai client.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from adapters.engine_server import EngineServer
from gateway.config import ModelConfig, Settings
from gateway.runtime import Runtime
from tests.engines.harness import running_gateway

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVED = "served-model"
USER = [{"role": "user", "content": "one two three"}]
TEXT = "tok0 tok1 tok2 tok3 tok4"


def fake(engine: str) -> list[str]:
    return [sys.executable, "-m", "tests.engines.fake_engine", engine]


ENGINES: dict[str, dict[str, Any]] = {
    "vllm": {"executable": fake("vllm")},
    "sglang": {"executable": fake("sglang")},
    "tensorrt_llm": {"executable": fake("tensorrt_llm")},
    "exllamav3": {"executable": fake("tabby"), "compute_capability": "8.6"},
    "exllamav2": {"executable": fake("tabby")},
    "dynamo": {"executable": fake("dynamo_frontend"), "worker_executable": fake("dynamo_worker")},
}
WITH_METRICS = {"vllm", "sglang", "tensorrt_llm", "dynamo"}


@dataclass
class Running:
    client: openai.OpenAI
    base_url: str
    adapter: EngineServer
    launches: Path


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@contextmanager
def gateway_for(engine: str, root: Path, emulator_args: str, **extra: Any) -> Iterator[Running]:
    source = root / "tiny-model"
    source.mkdir(exist_ok=True)
    launches = root / f"launches-{engine}.jsonl"
    env = {"PYTHONPATH": str(REPO_ROOT), "FAKE_ENGINE_ARGS": emulator_args, "FAKE_ENGINE_LOG": str(launches)}
    options = {**ENGINES[engine], "env": env, "log_dir": str(root / "logs"), "restart_backoff": 0.1, **extra}
    settings = Settings(models=(ModelConfig(source=str(source), name=SERVED, engine=engine, options=options),))
    runtime = Runtime.build(settings)
    adapter = next(iter(runtime.models)).adapter
    assert isinstance(adapter, EngineServer) and adapter.engine == engine
    with running_gateway(settings, runtime) as base_url:
        yield Running(openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0), base_url, adapter, launches)


@pytest.fixture(scope="module", params=sorted(ENGINES))
def running(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    engine = request.param
    # A loading phase first (port closed, 503 warm-up, or an empty model list, by style): start()
    # must wait it out by the engine's own readiness rule.
    with gateway_for(engine, tmp_path_factory.mktemp(engine), "--tokens 5 --startup-delay 0.5") as r:
        yield r


def test_started_by_its_readiness_rule_with_the_engines_own_flags(running: Running) -> None:
    launches = [json.loads(line) for line in running.launches.read_text().splitlines()]
    main = [entry for entry in launches if entry["engine"] != "dynamo_worker"]
    assert len(main) == 1, "one launch: readiness waited, nothing crashed"
    ready = httpx.get(running.base_url.removesuffix("/v1") + "/ready").json()
    assert ready["models"][SERVED]["ready"] is True


def test_chat_non_stream(running: Running) -> None:
    result = running.client.chat.completions.create(model=SERVED, messages=USER)
    assert result.choices[0].message.content == TEXT
    assert result.usage is not None and (result.usage.prompt_tokens, result.usage.completion_tokens) == (3, 5)


def test_chat_stream_with_and_without_usage(running: Running) -> None:
    chunks = list(running.client.chat.completions.create(
        model=SERVED, messages=USER, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == TEXT
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    plain = list(running.client.chat.completions.create(model=SERVED, messages=USER, stream=True))
    assert all(c.choices for c in plain), "the usage chunk the client did not ask for is not sent"
    assert "".join(c.choices[0].delta.content or "" for c in plain) == TEXT


def test_text_completions(running: Running) -> None:
    result = running.client.completions.create(model=SERVED, prompt="a b", max_tokens=3)
    assert result.choices[0].text == "tok0 tok1 tok2"


def test_the_engines_error_shape_becomes_an_openai_400(running: Running) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        running.client.chat.completions.create(model=SERVED, messages=USER, max_tokens=5000)
    assert "maximum context length is 4096" in err.value.message
    body = err.value.body
    assert isinstance(body, dict) and body.get("type") == "invalid_request_error"


def test_embeddings_where_the_engine_serves_them(running: Running) -> None:
    if not running.adapter.capabilities.embeddings:
        pytest.skip(f"{running.adapter.engine} does not serve embeddings")
    result = running.client.embeddings.create(model=SERVED, input=["hello world", "bye"])
    assert [len(d.embedding) for d in result.data] == [8, 8]
    assert result.usage.prompt_tokens == 3


def test_unsupported_operation_is_a_clear_400(running: Running) -> None:
    if running.adapter.capabilities.embeddings:
        pytest.skip(f"{running.adapter.engine} serves embeddings")
    with pytest.raises(openai.BadRequestError, match="does not support embeddings"):
        running.client.embeddings.create(model=SERVED, input="hello")


def test_engine_metrics_map_onto_the_gateways_names(running: Running) -> None:
    running.client.chat.completions.create(model=SERVED, messages=USER)
    text = httpx.get(running.base_url.removesuffix("/v1") + "/metrics").text
    line = f'enginegate_engine_generation_tokens{{engine="{running.adapter.engine}",model="{SERVED}"}}'
    if running.adapter.engine not in WITH_METRICS:
        assert line not in text
        return
    values = [float(row.split()[-1]) for row in text.splitlines() if row.startswith(line)]
    assert values and values[0] >= 5
    if running.adapter.engine == "dynamo":
        return  # the emulator exports a counter where the real frontend has a histogram (see test_dynamo_real)
    prompt = f'enginegate_engine_prompt_tokens{{engine="{running.adapter.engine}",model="{SERVED}"}}'
    assert any(row.startswith(prompt) and float(row.split()[-1]) >= 3 for row in text.splitlines())


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_crash_mid_stream_ends_the_stream_then_the_engine_restarts_and_stop_cleans_up(
    engine: str, tmp_path: Path
) -> None:
    with gateway_for(engine, tmp_path, "--tokens 5 --crash-after-tokens 2") as r:
        first_pid = r.adapter.process.pid
        assert first_pid is not None
        received = ""
        with pytest.raises(openai.APIError):
            for chunk in r.client.chat.completions.create(model=SERVED, messages=USER, stream=True):
                if chunk.choices:
                    received += chunk.choices[0].delta.content or ""
        assert received == "tok0 tok1"
        # The supervisor restarts the engine; the next request waits for it and succeeds.
        again = r.client.chat.completions.create(model=SERVED, messages=USER, max_tokens=2)
        assert again.choices[0].message.content == "tok0 tok1"
        assert r.adapter.process.restarts >= 1 and r.adapter.process.pid != first_pid
        pids = [p for p in (r.adapter.process.pid, getattr(getattr(r.adapter, "worker_process", None), "pid", None)) if p]
        run_dirs = [d for d in (getattr(r.adapter, "_run_dir", None), getattr(r.adapter, "_kv_dir", None)) if d]
    assert pids and not any(pid_alive(pid) for pid in pids + [first_pid]), "stop leaves no engine process"
    assert not any(Path(d).exists() for d in run_dirs), "stop removes the config it wrote"
