"""`enginegate plan` on this host with a tune record: measured next to predicted, the winner taken, stale ignored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.hardware import detect
from gateway.tuning.fingerprint import engine_version, host_fingerprint
from gateway.tuning.record import save
from tests.unit.tuning.helpers import WORKLOAD, planned, record, result


@pytest.fixture
def workload_file(tmp_path: Path) -> Path:
    path = tmp_path / "w.yaml"
    path.write_text(json.dumps(WORKLOAD.model_dump(exclude_defaults=True)))
    return path


def _save(tmp_path: Path, versions: dict[str, str | None] | None = None) -> Path:
    inproc = planned("llamacpp").options
    rec = record([result("llama_server", planned().options, goodput=1.0, label="slots"),
                  result("llamacpp", inproc, goodput=2.0, decode=77.0, label="inproc")],
                 versions=versions or {e: engine_version(e) for e in ("llamacpp", "llama_server")})
    rec = rec.model_copy(update={"host": host_fingerprint(detect())})
    return save(rec, tmp_path / "tune")


def _plan(capsys: pytest.CaptureFixture[str], *args: str) -> dict:  # type: ignore[type-arg]
    assert main(["plan", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_takes_the_record_and_shows_measured_beside_predicted(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workload_file: Path) -> None:
    monkeypatch.setenv("ENGINEGATE_TUNE_DIR", str(tmp_path / "tune"))
    path = _save(tmp_path)
    p = _plan(capsys, "--workload", str(workload_file))
    assert p["engine"] == "llamacpp" and p["rule"] == "measured"
    assert p["measured"]["record"] == str(path) and p["measured"]["taken"]
    assert p["calibration"]["engine"] == "llamacpp"
    assert p["capacity"]["decode_tokens_per_s"] == pytest.approx(77.0)
    assert main(["plan", "--workload", str(workload_file)]) == 0
    text = capsys.readouterr().out
    assert "measured 1. llamacpp inproc: 77.0 tokens/s alone" in text
    assert "measured 2. llama_server slots" in text
    assert "speed    ~77.0 tokens/s per sequence" in text and "(calibrated on this host; uncalibrated bound" in text
    ignored = _plan(capsys, "--workload", str(workload_file), "--no-tune")
    assert ignored["engine"] == "llama_server" and ignored["measured"] is None


def test_a_stale_record_is_ignored_with_a_note(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workload_file: Path) -> None:
    monkeypatch.setenv("ENGINEGATE_TUNE_DIR", str(tmp_path / "tune"))
    _save(tmp_path, versions={"llamacpp": "llama_cpp_python 0.0.1", "llama_server": "old"})
    p = _plan(capsys, "--workload", str(workload_file))
    assert p["engine"] == "llama_server" and p["measured"] is None and p["calibration"] is None
    notes = [w for w in p["warnings"] if "ignored: other engine version (" in w]
    assert len(notes) == 1 and "llamacpp 'llama_cpp_python 0.0.1' -> " in notes[0]
