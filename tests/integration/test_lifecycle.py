"""Cancellation, back-pressure, limits and start-up failures on the real gateway and model."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from tests.gateway_process import REPO_ROOT, RunningGateway, gateway
from tests.model_facts import eos_token_id
from tests.unit.test_api_stream import metric_value

pytestmark = pytest.mark.integration

MODEL = "smollm2-135m-instruct"
LONG = 1500  # tokens the model would produce if nobody stopped it (EOS is banned below)


def endless_chat(max_tokens: int = LONG) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Count from one to one thousand."}],
        "max_tokens": max_tokens,
        "stream": True,
        "logit_bias": {str(eos_token_id()): -100},
    }


def wait_for_metric(gw: RunningGateway, name: str, expected: float, **labels: str) -> str:
    for _ in range(600):
        text = gw.metrics()
        if metric_value(text, name, **labels) == expected:
            return text
        time.sleep(0.1)
    raise AssertionError(f"{name}{labels} never became {expected}")


def test_client_disconnect_stops_generation_within_a_few_tokens(gw: RunningGateway) -> None:
    labels = {"model": MODEL, "engine": "llamacpp"}
    before = metric_value(gw.metrics(), "enginegate_engine_generation_tokens", **labels)
    disconnects_before = metric_value(gw.metrics(), "enginegate_client_disconnects_total", **labels)
    with httpx.stream("POST", gw.base_url + "/chat/completions", json=endless_chat(), timeout=60) as r:
        received = 0
        for line in r.iter_lines():
            if '"content"' in line:
                received += 1
            if received == 3:
                break
    # The engine's own running count drops to zero once its worker thread has stopped.
    text = wait_for_metric(gw, "enginegate_engine_requests_running", 0, **labels)
    generated = metric_value(text, "enginegate_engine_generation_tokens", **labels) - before
    assert 3 <= generated < LONG // 5, f"generated {generated} tokens after the client left"
    assert metric_value(text, "enginegate_client_disconnects_total", **labels) == disconnects_before + 1
    assert "generation cancelled after" in gw.log()
    # The slot is free again: the next request is served.
    r = httpx.post(gw.base_url + "/chat/completions", json={**endless_chat(4), "stream": False}, timeout=60)
    assert r.status_code == 200


CONFIG = """
max_body_bytes: 4096
retry_after_seconds: 2
models:
  - source: default
    max_queue: 0
    context_length: 256
"""


@pytest.fixture(scope="module")
def strict_gw():  # type: ignore[no-untyped-def]
    with gateway(config_yaml=CONFIG) as running:
        yield running


def test_full_queue_answers_429_with_retry_after(strict_gw: RunningGateway) -> None:
    holder_started = threading.Event()

    def hold_slot() -> None:
        with httpx.stream("POST", strict_gw.base_url + "/chat/completions", json=endless_chat(200), timeout=120) as r:
            for line in r.iter_lines():
                if '"content"' in line:
                    holder_started.set()

    t = threading.Thread(target=hold_slot)
    t.start()
    assert holder_started.wait(60)
    client = openai.OpenAI(base_url=strict_gw.base_url, api_key="x", max_retries=0)
    with pytest.raises(openai.RateLimitError) as err:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert err.value.response.headers["retry-after"] == "2"
    assert err.value.code == "queue_full"
    t.join()
    # The series exists from the first scrape (zeroed per model), so check the count, not the name.
    assert metric_value(strict_gw.metrics(), "enginegate_requests_rejected_total", model=MODEL) == 1


def test_body_over_the_configured_limit_is_413(strict_gw: RunningGateway) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 8000}]}
    r = httpx.post(strict_gw.base_url + "/chat/completions", json=body, timeout=30)
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"


def test_prompt_over_the_context_is_a_400_not_a_500(strict_gw: RunningGateway) -> None:
    words = " ".join(["word"] * 600)  # under the 4096-byte body limit, over the 256-token context
    for route, body in (("/completions", {"prompt": words}), ("/chat/completions", {"messages": [{"role": "user", "content": words}]})):
        r = httpx.post(strict_gw.base_url + route, json={"model": MODEL, "max_tokens": 1, **body}, timeout=60)
        assert r.status_code == 400, r.text
        assert "context" in r.json()["error"]["message"]


def test_logit_bias_out_of_vocabulary_is_a_400(strict_gw: RunningGateway) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "logit_bias": {"99999999": 5}}
    r = httpx.post(strict_gw.base_url + "/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias"


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_hub_reference_offline_gives_a_clear_error() -> None:
    result = run_cli("serve", "--model", "TheOrg/some-model-GGUF/model.Q4_K_M.gguf", "--port", "1",
                     env={"HF_HUB_OFFLINE": "1", "HF_HOME": "/tmp/enginegate-empty-hf-home"})
    assert result.returncode == 2
    assert "offline" in result.stderr and "huggingface-cli download TheOrg/some-model-GGUF" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_model_file_gives_a_clear_error() -> None:
    result = run_cli("serve", "--model", "/nonexistent/model.gguf", "--port", "1")
    assert result.returncode == 2
    assert "model file not found: /nonexistent/model.gguf" in result.stderr
    assert "Traceback" not in result.stderr


def test_sigterm_stops_the_gateway_cleanly() -> None:
    with gateway() as gw:
        os.killpg(gw.process.pid, signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal so the exit status tells why.
        assert gw.process.wait(timeout=60) in (0, -signal.SIGTERM)
        assert "Application shutdown complete" in gw.log()


def test_an_engine_that_is_not_installed_falls_back_to_the_next_ranked_one_and_says_so() -> None:
    with gateway(config_yaml="models:\n  - source: default\n    engine: sglang\n    context_length: 512\n") as gw:
        view = httpx.get(gw.url + "/v1/gateway/plan", timeout=10).json()["models"][MODEL]
        assert view["state"] == "loaded" and view["engine"] == "llamacpp"
        failed = view["fallbacks"][0]
        assert failed["engine"] == "sglang" and "not installed" in failed["reason"] and "pip install" in failed["reason"]
        r = httpx.post(gw.base_url + "/chat/completions", json={**endless_chat(2)}, timeout=60)
        assert r.status_code == 200


def test_a_single_model_whose_every_engine_fails_stops_start_up_with_the_reason(tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "broken.yaml"
    config.write_text("models:\n  - source: default\n    engine: llamacpp\n"
                      "    options: {llama_kwargs: {model_path: /nonexistent/weights.gguf}}\n")
    result = run_cli("serve", "--port", "1", "--config", str(config))
    assert result.returncode == 3
    assert "cannot start:" in result.stderr and "/nonexistent/weights.gguf" in result.stderr
    assert "Traceback" not in result.stderr
