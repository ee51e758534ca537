"""The planned speed-ups on a real llama-server: `enginegate serve` with an edit workload plans n-gram
speculation, the engine runs with it, and its acceptance rate reaches /metrics and the status page's
stats; `enginegate tune` measures speculation on and off under a short budget and `plan` shows both.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import psutil
import pytest
import yaml

from adapters.llama_server import find_llama_server
from gateway.modelsource import embedded_model_path
from gateway.tuning.record import TuneRecord
from tests.gateway_process import REPO_ROOT, RunningGateway, gateway

pytestmark = pytest.mark.integration
if find_llama_server(None) is None:
    pytest.skip("needs llama-server (enginegate engines install llama-server)", allow_module_level=True)

EDIT = {"prompt_tokens": 80, "output_tokens": 80, "output_copies_prompt": True, "context_length": 1024,
        "requests": "one_shot"}
CONFIG = """\
models:
  - source: {weights}
    name: smollm
    embeddings: false
    workload: {workload}
    options: {{threads: 1, log_dir: "{logs}"}}
"""
TEXT = ("The lighthouse keeper woke before dawn and climbed the stairs to the lamp room. He cleaned the lens, "
        "checked the oil and wrote the weather in his log book. In the afternoon he walked to the village.")
COPY = [{"role": "user", "content": f"Repeat this text exactly, word for word:\n\n{TEXT}"}]
RUN_TIMEOUT_S = 600  # a bound so nothing hangs; not a performance limit


def metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") and 'model="smollm"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("features")
    config = CONFIG.format(weights=embedded_model_path(), workload=yaml.safe_dump(EDIT, default_flow_style=True).strip(),
                           logs=tmp)
    with gateway(config_yaml=config) as gw:
        yield gw


def test_planned_speculation_reaches_the_engines_command_line(served: RunningGateway) -> None:
    engines = [p for p in psutil.Process(served.process.pid).children(recursive=True) if "llama-server" in p.name()]
    assert len(engines) == 1, engines
    argv = engines[0].cmdline()
    assert argv[argv.index("--spec-type") + 1] == "ngram-simple"
    assert argv[argv.index("--cache-ram") + 1] == "0"  # one-shot edits, no shared prefixes: no host-RAM prompt cache
    plan = httpx.get(served.url + "/v1/gateway/plan", timeout=10).json()["plans"]["smollm"]
    speculation = next(f for f in plan["features"] if f["feature"] == "speculation")
    assert speculation["choice"] == "ngram" and "copy the prompt" in speculation["reason"]


def test_the_acceptance_rate_reaches_metrics_and_the_stats(served: RunningGateway) -> None:
    client = openai.OpenAI(base_url=served.base_url, api_key="unused", max_retries=0, timeout=120)
    for _ in range(2):  # the n-gram table warms up over requests
        client.chat.completions.create(model="smollm", messages=COPY, max_tokens=60, temperature=0)  # type: ignore[arg-type]
    text = served.metrics()
    drafted = metric(text, "enginegate_engine_draft_tokens")
    accepted = metric(text, "enginegate_engine_draft_accepted_tokens")
    assert drafted and drafted > 0 and accepted is not None and accepted > 0
    assert metric(text, "enginegate_engine_draft_acceptance_ratio") == pytest.approx(accepted / drafted)
    stats = httpx.get(served.url + "/v1/gateway/stats", timeout=10).json()["models"]["smollm"]
    assert stats["speculation"]["drafted"] == drafted and 0 < stats["speculation"]["acceptance"] <= 1


def test_tune_measures_speculation_on_and_off_and_plan_shows_both(tmp_path: Path) -> None:
    workload = tmp_path / "edit.yaml"
    workload.write_text(yaml.safe_dump({**EDIT, "prompt_tokens": 24, "output_tokens": 24}))
    env = {**os.environ, "ENGINEGATE_TUNE_DIR": str(tmp_path / "tune"), "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-m", "gateway", "tune", "--workload", str(workload), "--engines",
                           "llama_server", "--max-variants", "2", "--budget-seconds", "90", "--requests", "2", "--json"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env)
    assert done.returncode == 0, done.stderr
    record = TuneRecord.model_validate_json(done.stdout)
    measured = {r.options.get("spec_type"): r for r in record.results}
    assert set(measured) == {"ngram-simple", "none"}, [r.label for r in record.results]
    assert all(r.ok and r.decode_tokens_per_s for r in measured.values())
    assert "spec_type=ngram-simple" in measured["ngram-simple"].label and measured["ngram-simple"].label.endswith("(planned)")
    shown = subprocess.run([sys.executable, "-m", "gateway", "plan", "--workload", str(workload)], cwd=REPO_ROOT,
                           capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env)
    assert shown.returncode == 0, shown.stderr
    lines = [line for line in shown.stdout.splitlines() if line.startswith("measured ")]
    assert any("spec_type=none" in line and "tokens/s alone" in line for line in lines), shown.stdout
    assert any("spec_type=ngram-simple" in line for line in lines)
    assert "feature  speculation ngram: outputs copy the prompt" in shown.stdout
