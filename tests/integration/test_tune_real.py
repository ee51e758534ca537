"""`enginegate tune` for real: in-process llama.cpp and llama-server on the embedded model, a short budget.

The run's record is then used by `enginegate plan` and by `enginegate serve` (the official openai
client talks to it). A llama-server that fails at start and one that is missing are recorded with why.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest
import yaml

from adapters.llama_server import find_llama_server
from gateway.tuning.record import TuneRecord
from gateway.tuning.tune import score
from tests.gateway_process import REPO_ROOT, gateway

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(find_llama_server(None) is None, reason="needs llama-server: enginegate engines install llama-server"),
]
WORKLOAD = {"prompt_tokens": 16, "output_tokens": 8, "concurrency": 2, "context_length": 512}
RUN_TIMEOUT_S = 600  # a bound so nothing hangs; not a performance limit


@dataclass
class Tuned:
    dir: Path
    workload: Path
    record: TuneRecord
    record_path: Path
    stderr: str
    plot: Path


def _tune(tmp: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", "tune", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S,
                          env={**os.environ, "ENGINEGATE_TUNE_DIR": str(tmp / "tune"), **(env or {})})


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> Tuned:
    tmp = tmp_path_factory.mktemp("tune")
    workload = tmp / "workload.yaml"
    workload.write_text(yaml.safe_dump(WORKLOAD))
    done = _tune(tmp, "--workload", str(workload), "--engines", "llamacpp,llama_server", "--max-variants", "2",
                 "--budget-seconds", "120", "--requests", "3", "--json", "--plot", str(tmp / "tune.png"))
    assert done.returncode == 0, done.stderr
    files = list((tmp / "tune").glob("*.json"))
    assert len(files) == 1
    record = TuneRecord.model_validate_json(files[0].read_text())
    assert TuneRecord.model_validate_json(done.stdout) == record
    return Tuned(tmp / "tune", workload, record, files[0], done.stderr, tmp / "tune.png")


def test_tune_measures_both_engines_and_ranks_them(tuned: Tuned) -> None:
    ok = [r for r in tuned.record.results if r.ok]
    assert {r.engine for r in ok} == {"llamacpp", "llama_server"}
    for r in ok:
        assert r.decode_tokens_per_s and r.decode_tokens_per_s > 0
        assert r.output_tokens_per_s and r.output_tokens_per_s > 0
        assert r.ttft_p50_s and r.tpot_p50_s and r.load_s
        assert r.peak_memory_bytes and r.peak_memory_bytes > 50 * 2**20  # the weights alone are ~100 MB
        assert r.goodput_rps is not None and r.concurrency == 2
    assert [score(r) for r in ok] == sorted((score(r) for r in ok), reverse=True)
    assert tuned.record.engine_versions["llamacpp"] and tuned.record.engine_versions["llama_server"]
    assert "[1/" in tuned.stderr and "ready in" in tuned.stderr and "winner:" in tuned.stderr
    assert tuned.plot.read_bytes()[:4] == b"\x89PNG"


def test_plan_takes_the_measured_winner(tuned: Tuned) -> None:
    done = subprocess.run([sys.executable, "-m", "gateway", "plan", "--workload", str(tuned.workload), "--json"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ENGINEGATE_TUNE_DIR": str(tuned.dir)})
    assert done.returncode == 0, done.stderr
    p = json.loads(done.stdout)
    winner = tuned.record.winner
    assert winner is not None
    assert p["engine"] == winner.engine and p["options"] == winner.options
    assert p["measured"]["taken"] and p["measured"]["record"] == str(tuned.record_path)
    assert p["calibration"]["engine"] == winner.engine
    assert p["capacity"]["decode_tokens_per_s"] == pytest.approx(
        p["calibration"]["effective_bandwidth_gbps"] * 1e9 / p["capacity"]["bytes_per_token"])


def test_serve_uses_the_record_and_the_users_setting_still_wins(tuned: Tuned) -> None:
    winner = tuned.record.winner
    assert winner is not None
    mine = 1 if winner.options.get("threads") != 1 else 2
    config = {"models": [{"source": "default", "name": "smol", "workload": WORKLOAD, "options": {"threads": mine}}]}
    with gateway(config_yaml=yaml.safe_dump(config), env={"ENGINEGATE_TUNE_DIR": str(tuned.dir)}) as gw:
        plan: dict[str, Any] = httpx.get(gw.url + "/v1/gateway/plan", timeout=30).json()
        text = json.dumps(plan)
        client = openai.OpenAI(base_url=gw.base_url, api_key="unused")
        answer = client.chat.completions.create(model="smol", max_tokens=8,
                                                messages=[{"role": "user", "content": "Hello!"}])
    assert answer.choices[0].message.content
    model_plan = plan["plans"]["smol"]
    assert model_plan["engine"] == winner.engine
    assert model_plan["measured"]["taken"]
    assert model_plan["options"]["threads"] == mine
    assert {"option": "threads", "planned": winner.options["threads"], "chosen": mine} in model_plan["overridden"]
    assert "measured on this host by `enginegate tune`" in text


def _fake_cache(tmp: Path, script: str | None) -> dict[str, str]:
    cache = tmp / "cache"
    (cache / "bin").mkdir(parents=True, exist_ok=True)
    binary = cache / "bin" / "llama-server"
    if script is None:
        binary.unlink(missing_ok=True)
    else:
        binary.write_text(script)
        binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if not (Path(p) / "llama-server").exists())
    return {"ENGINEGATE_CACHE": str(cache), "PATH": path}


BROKEN = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "version: 0 (broken build)"; exit 0; fi
echo "error: this llama-server build is broken" >&2
exit 1
"""


def test_a_broken_candidate_is_reported_and_the_others_measured(tmp_path: Path) -> None:
    workload = tmp_path / "w.yaml"
    workload.write_text(yaml.safe_dump(WORKLOAD))
    done = _tune(tmp_path, "--workload", str(workload), "--engines", "llama_server,llamacpp", "--max-variants", "1",
                 "--budget-seconds", "90", "--requests", "2", env=_fake_cache(tmp_path, BROKEN))
    assert done.returncode == 0, done.stderr
    record = TuneRecord.model_validate_json(next((tmp_path / "tune").glob("*.json")).read_text())
    by_engine = {r.engine: r for r in record.results}
    assert by_engine["llamacpp"].ok
    broken = by_engine["llama_server"]
    assert broken.status == "failed" and broken.reason and "broken" in broken.reason
    assert record.winner is not None and record.winner.engine == "llamacpp"
    assert "failed" in done.stdout  # the table shows it, with its reason


def test_a_missing_binary_is_reported_not_started(tmp_path: Path) -> None:
    done = _tune(tmp_path, "--engines", "llama_server", "--budget-seconds", "60", env=_fake_cache(tmp_path, None))
    assert done.returncode == 1, done.stderr  # nothing measured: no winner
    record = TuneRecord.model_validate_json(next((tmp_path / "tune").glob("*.json")).read_text())
    (only,) = record.results
    assert only.status == "not_installed" and "enginegate engines install llama-server" in (only.reason or "")
    assert "not installed" in done.stdout


def _variant_processes(tmp: Path, tune_pid: int) -> list[str]:
    """Processes this run started besides tune itself (they inherit its ENGINEGATE_TEST_MARK): gateways, engines."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "environ"]):
        with contextlib.suppress(psutil.Error):
            if p.info["pid"] != tune_pid and (p.info["environ"] or {}).get("ENGINEGATE_TEST_MARK") == str(tmp):
                found.append(f"{p.info['pid']} {' '.join(p.info['cmdline'] or [])}")
    return found


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_tune_stopped_mid_measurement_leaves_no_engine_behind(tmp_path: Path, sig: signal.Signals) -> None:
    workload = tmp_path / "w.yaml"
    workload.write_text(yaml.safe_dump({**WORKLOAD, "output_tokens": 64}))
    env = {**os.environ, "ENGINEGATE_TUNE_DIR": str(tmp_path / "tune"), "ENGINEGATE_TEST_MARK": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "tune", "--workload", str(workload), "--engines",
                             "llama_server", "--budget-seconds", "120", "--requests", "8"], cwd=REPO_ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    seen = ""
    deadline = time.monotonic() + 180
    while "measuring" not in seen and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen += line
    assert "measuring" in seen, seen
    assert any("llama-server" in p for p in _variant_processes(tmp_path, proc.pid)), "the variant's gateway and engine should be running now"
    proc.send_signal(sig)
    rest = proc.communicate(timeout=120)[1]
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and "interrupted (no record written)" in rest
        assert not list((tmp_path / "tune").glob("*.json"))
    left = _variant_processes(tmp_path, proc.pid)
    deadline = time.monotonic() + 60
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = _variant_processes(tmp_path, proc.pid)
    assert not left, left
