"""`enginegate plan` on checkpoints whose experts sit in some layers only: the weights it reports, where
that figure comes from, and a plan on a host that holds them (issue 39)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.commands.test_commands import run
from tests.unit.hosts import MODELS
from tests.unit.planning.snapshots import host_snapshot

MAVERICK_PARAMS = 400e9
"""Llama 4 Maverick's published total (model card: 17B active, 400B total)."""


def _hardware(tmp_path: Path, name: str) -> Path:
    hw = tmp_path / f"{name}.json"
    hw.write_text(host_snapshot(name).model_dump_json())
    return hw


def test_maverick_bf16_weights_are_2_bytes_per_published_parameter_and_fit_8_h200(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hw = _hardware(tmp_path, "8x-h200-nvswitch")  # 8 x 141 GB: about 1,015 GB usable at 90 %
    argv = ["plan", "--model", str(MODELS / "llama-4-maverick"), "--hardware", str(hw), "--installed", "vllm,sglang"]
    assert run([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    weights = data["capacity"]["weights_bytes"]
    assert abs(weights - 2 * MAVERICK_PARAMS) / (2 * MAVERICK_PARAMS) <= 0.03
    assert data["spec"]["weights_source"] == "arithmetic" and data["spec"]["moe_layers"] == 24
    assert data["engine"] in ("vllm", "sglang") and data["capacity"]["fit"] == "fast"
    assert data["capacity"]["devices_used"] == 8 and data["capacity"]["required_bytes"] <= data["capacity"]["usable_bytes"]
    assert run(argv) == 0
    text = capsys.readouterr().out
    assert f"weights  {weights / 1e9:.1f} GB from config.json arithmetic" in text
    assert "params   401.6B total, 17.2B active per token; 24 of 48 layers hold 128 experts (1 routed per token); " \
           "36 of 48 layers keep 8192 tokens of KV; vision tower and projector 871M" in text


def test_maverick_does_not_fit_8_h100_and_the_figures_say_by_how_much(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hw = _hardware(tmp_path, "8x-h100-nvswitch")  # 8 x 80 GB: about 616 GB usable, under the ~803 GB of weights
    assert run(["plan", "--model", str(MODELS / "llama-4-maverick"), "--hardware", str(hw), "--installed", "vllm"]) == 2
    err = capsys.readouterr().err
    assert "(weights 803.2 GB + paged KV" in err and "8 GPU(s) 615.7 GB usable, it would take" in err


def test_the_plan_says_the_index_gave_the_weights(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "maverick"
    d.mkdir()
    (d / "config.json").write_text((MODELS / "llama-4-maverick" / "config.json").read_text())
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 600_000_000_000},
                                                                "weight_map": {}}))
    hw = _hardware(tmp_path, "8x-h200-nvswitch")
    argv = ["plan", "--model", str(d), "--hardware", str(hw), "--installed", "vllm,sglang"]
    assert run([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["spec"]["weights_source"] == "index" and data["capacity"]["weights_bytes"] == 600_000_000_000
    assert any("600.0 GB" in w and "config arithmetic 803.2 GB" in w for w in data["warnings"])
    assert run(argv) == 0
    assert "weights  600.0 GB from the checkpoint index's metadata.total_size (config arithmetic: 803.2 GB)" in (
        capsys.readouterr().out
    )
