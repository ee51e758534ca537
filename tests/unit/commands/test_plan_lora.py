"""`enginegate plan --adapter ...`: the adapters, the LoRA flags chosen (slots, max rank, loading) and their memory,
in the text and in --json (Plan.lora), for llama-server on this host and vLLM on a recorded 8x H100."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.modelsource import embedded_model_path
from tests.lora_adapters import make_lora
from tests.unit.hosts import MODELS, host


def peft(path: Path, rank: int) -> Path:
    path.mkdir()
    (path / "adapter_config.json").write_text(json.dumps({"r": rank, "target_modules": ["q_proj", "v_proj"]}))
    (path / "adapter_model.safetensors").write_bytes(b"\0" * 1000)
    return path


def test_llama_server_for_the_embedded_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = make_lora(embedded_model_path(), tmp_path / "a.gguf", 1)
    argv = ["plan", "--adapter", f"tone-a={a}", "--adapter", f"tone-off={a}@0"]
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["engine"] == "llama_server"  # the in-process engine loads one adapter per context
    lo = data["lora"]
    assert [(x["name"], x["scale"]) for x in lo["adapters"]] == [("tone-a", 1.0), ("tone-off", 0.0)]
    assert lo["engine_flags"] == ["--lora", str(a), "--lora-init-without-apply"]
    assert lo["file_bytes"] == a.stat().st_size and lo["slots"] is None
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert f"lora     tone-off: {a} (" in text and "scale 0" in text
    assert f"lora     flags --lora {a} --lora-init-without-apply" in text
    assert "adapter(s): served by llama_server" in text


def test_vllm_slots_rank_and_slot_memory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hw = tmp_path / "hgx.json"
    hw.write_text(host("hgx-8x-h100").model_dump_json())
    adapters = [peft(tmp_path / n, 12) for n in ("a", "b", "c")]
    argv = ["plan", "--model", str(MODELS / "llama-3-8b"), "--hardware", str(hw), "--installed", "vllm",
            *(x for p in adapters for x in ("--adapter", f"t-{p.name}={p}"))]
    assert main([*argv, "--json"]) == 0
    lo = json.loads(capsys.readouterr().out)["lora"]
    assert lo["engine_flags"][-6:] == ["--max-loras", "3", "--max-lora-rank", "16", "--max-cpu-loras", "3"]
    assert (lo["slots"], lo["max_rank"], lo["loading"], lo["loaded_at_once"]) == (3, 16, "start", 3)
    # llama-3-8b: 32 layers, q/o 4096 x 4096, k/v 4096 x 1024: rank 16 x 3 slots x 26624 widths x 2 bytes
    assert lo["slot_bytes"] == 3 * 16 * 26624 * 32 * 2 and lo["file_bytes"] == 3 * (1000 + len(
        (adapters[0] / "adapter_config.json").read_bytes()))
    assert main([*argv, "--lora-loading", "runtime", "--max-loras", "2"]) == 0
    text = capsys.readouterr().out
    assert "lora     loading runtime: 2 loaded at once, 2 in a batch, max rank 16" in text
    assert "lora     flags --enable-lora --max-loras 2 --max-lora-rank 16 --max-cpu-loras 2" in text
    assert "the slots reserve >= 54.5 MB of buffers" in text


def test_what_the_engine_refuses_is_said_not_crashed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hw = tmp_path / "hgx.json"
    hw.write_text(host("hgx-8x-h100").model_dump_json())
    a = peft(tmp_path / "a", 8)
    argv = ["plan", "--model", str(MODELS / "llama-3-8b"), "--hardware", str(hw), "--installed", "vllm",
            "--adapter", f"half={a}@0.5"]
    assert main(argv) == 0
    assert "lora     adapters half: vLLM applies an adapter at its trained alpha" in capsys.readouterr().out
    assert main(["plan", "--adapter", "nameonly"]) == 2
    assert "--adapter 'nameonly': give NAME=PATH" in capsys.readouterr().err
    assert main(["plan", "--adapter", f"x={tmp_path / 'missing'}"]) == 2
    assert "does not exist" in capsys.readouterr().err
