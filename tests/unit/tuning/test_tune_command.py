"""`enginegate tune` refuses bad input with one clear line and status 2, before starting any engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli import main
from gateway.tuning.record import load_all


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["tune", *args])
    return code, capsys.readouterr().err


def test_unknown_engine(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(capsys, "--engines", "llamacpp,warp9")
    assert code == 2 and "enginegate tune: --engines: unknown engine(s) warp9; known: " in err and "llama_server" in err


def test_budget_too_small_for_one_candidate(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGINEGATE_TUNE_DIR", str(tmp_path))
    code, err = _run(capsys, "--engines", "llamacpp", "--budget-seconds", "2")
    assert code == 2 and "--budget-seconds 2 is too small for one candidate: llamacpp" in err
    assert "give at least" in err
    assert load_all(tmp_path) == ([], [])  # nothing measured, nothing written


@pytest.mark.parametrize(("text", "expected"), [
    ("prompt_tokens: [1\n", "not valid YAML"),
    ("prompt_tokens: 0\n", "prompt_tokens: Input should be greater than or equal to 1"),
    ("concurency: 4\n", "concurency: Extra inputs are not permitted"),
    ("- 1\n- 2\n", "a workload file is a YAML mapping"),
])
def test_workload_file_with_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(text)
    code, err = _run(capsys, "--workload", str(path))
    assert code == 2 and err.startswith(f"enginegate tune: {path}") and expected in err


@pytest.mark.parametrize("args", [["--budget-seconds", "0"], ["--requests", "0"], ["--engines", ","],
                                  ["--model", "/nonexistent/model.gguf"], ["--workload", "/nonexistent.yaml"]])
def test_other_bad_flags(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    code, err = _run(capsys, *args)
    assert code == 2 and err.startswith("enginegate tune: ") and len(err.strip().splitlines()) == 1
