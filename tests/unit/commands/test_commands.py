"""The detect / plan / doctor commands, run in-process through argparse as the CLI will."""

import argparse
import json
from pathlib import Path

import pytest

from gateway.commands import detect as detect_cmd
from gateway.commands import doctor as doctor_cmd
from gateway.commands import plan as plan_cmd
from gateway.hardware import HardwareSnapshot
from gateway.modelsource import embedded_model_path
from tests.unit.hosts import MODELS, host


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="enginegate")
    sub = parser.add_subparsers(required=True)
    for module in (detect_cmd, plan_cmd, doctor_cmd):
        module.register(sub)
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


def test_detect_json_round_trips(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["detect", "--json"]) == 0
    snapshot = HardwareSnapshot.model_validate_json(capsys.readouterr().out)
    assert snapshot.cpu.logical_cores


def test_detect_readable(capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.hardware import detect

    assert run(["detect"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == detect().summary()
    assert any(line.startswith("CPU ") for line in lines) and any(line.startswith("RAM ") for line in lines)


def test_plan_default_model_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["plan", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["engine"] == "llamacpp"
    assert data["model"] == str(embedded_model_path())
    assert {"context_length", "threads", "gpu_layers", "parallel"} <= set(data["options"])


def test_plan_with_recorded_hardware_and_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hw = tmp_path / "hgx.json"
    hw.write_text(host("hgx-8x-h100").model_dump_json())
    wl = tmp_path / "w.yaml"
    wl.write_text("mode: production\nobjective: throughput\n")
    argv = ["plan", "--model", str(MODELS / "llama-3-8b"), "--hardware", str(hw), "--workload", str(wl), "--json"]
    assert run([*argv, "--installed", "vllm,sglang"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["engine"] == "vllm" and data["candidates"][0]["engine"] == "tensorrt_llm"
    assert {"engine": "tensorrt_llm", "constraint": "installed"}.items() <= data["rejected"][0].items()
    assert run([*argv, "--installed", "vllm,ollama"]) == 2
    assert "unknown engine(s) ollama" in capsys.readouterr().err


def test_plan_readable_and_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert run(["plan"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("engine   llamacpp") and "why      " in out
    assert run(["plan", "--model", str(tmp_path / "missing.gguf")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_doctor_measures_and_detect_then_reports_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ENGINEGATE_CACHE_DIR", str(tmp_path))
    assert run(["doctor", "--size-mib", "16", "--repeats", "2"]) == 0
    assert "GB/s" in capsys.readouterr().out
    assert run(["detect", "--json"]) == 0
    snapshot = HardwareSnapshot.model_validate_json(capsys.readouterr().out)
    assert snapshot.cpu.measured_bandwidth_gbps and snapshot.cpu.measured_bandwidth_gbps > 0
    assert run(["plan", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["capacity"]["decode_tokens_per_s"] > 0


def test_plan_prints_concurrency_free_gpus_and_what_was_assumed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.unit.planning.snapshots import host_snapshot, null_vram

    hw = tmp_path / "h200.json"
    hw.write_text(host_snapshot("8x-h200-nvswitch").model_dump_json())
    wl = tmp_path / "w.yaml"
    wl.write_text("mode: production\nconcurrency: 64\nprompt_tokens: 1500\noutput_tokens: 500\n")
    argv = ["plan", "--model", str(MODELS / "llama-3-70b"), "--hardware", str(hw), "--workload", str(wl)]
    assert run([*argv, "--installed", "vllm"]) == 0
    out = capsys.readouterr().out
    assert "kv room " in out and "sequences at once of 2000 tokens (typical)" in out and "at the full 8192" in out
    # 141 GB of bf16 weights take over half of two H200s (2 x 151 GB x 0.9): production takes four
    assert "gpus     used 0,1,2,3 (tensor parallel 4, pipeline 1); free 4,5,6,7" in out
    assert "speed    <= " in out and "tokens/s aggregate over 64" in out
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps(null_vram()))
    assert run(["plan", "--model", str(MODELS / "llama-3-8b"), "--hardware", str(unknown), "--installed", "vllm"]) == 0
    assert "assumed  GPU 0 (NVIDIA H100 80GB HBM3) reported no memory size: assumed the datasheet's 80 GB" in (
        capsys.readouterr().out
    )


@pytest.mark.parametrize(
    "flag,text,message",
    [
        ("--workload", "mode: production\nconcurrency: [64\n", "line 3, column 1: not valid YAML"),
        ("--workload", "concurrency: 0\nmode: prod\n", "concurrency: Input should be greater than or equal to 1"),
        ("--rules", "rules:\n  - name: x\n   when: {}\n", "not valid YAML"),
        ("--rules", "rules:\n  - {name: x, when: {}, prefer: [vllm]}\n", "because: Field required"),
    ],
)
def test_bad_workload_and_rules_files_give_a_message_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, text: str, message: str
) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    assert run(["plan", flag, str(f)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"enginegate plan: {f}") and message in err and "Traceback" not in err


def test_no_engine_prints_the_numbers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hw = tmp_path / "hgx.json"
    hw.write_text(host("hgx-8x-h100").model_dump_json())
    assert run(["plan", "--model", str(MODELS / "deepseek-v3"), "--hardware", str(hw)]) == 2
    err = capsys.readouterr().err
    assert "no engine can serve" in err and "Memory: needs" in err and "8 GPU(s) 615.7 GB usable" in err


def test_a_broken_hardware_snapshot_is_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hw = tmp_path / "hw.json"
    hw.write_text('{"os": "Linux", "cpu": {"architecture": "x86_64"}, "memory": {"total_bytes": "lots"}')
    assert run(["plan", "--hardware", str(hw)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"enginegate plan: {hw}") and "expected `enginegate detect --json` output" in err
    assert "\n" not in err.strip()
