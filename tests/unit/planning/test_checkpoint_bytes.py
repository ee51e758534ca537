"""The checkpoint's own word on its weights: the index's total_size, the safetensors headers, the GGUF
tensor table; the config arithmetic as the fallback and the cross-check (gateway/planning/checkpoint.py).

Safetensors files are written by the safetensors library itself; large ones are sparse (a real header,
the data region left as a hole), as a checkpoint still downloading looks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from safetensors.numpy import save_file

from gateway.planning import load_spec
from gateway.planning.checkpoint import HeaderError, safetensors_data_bytes
from tests.unit.hosts import MODELS

MAVERICK = json.loads((MODELS / "llama-4-maverick" / "config.json").read_text())


def _dir(tmp_path: Path, config: dict[str, Any], name: str = "m") -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    return d


def _index(d: Path, total: int | None, files: tuple[str, ...] = ("model-00001-of-00001.safetensors",)) -> None:
    meta = {"total_size": total} if total is not None else {}
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": meta, "weight_map": {f"t{i}": f for i, f in enumerate(files)}})
    )


def _sparse_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], int]]) -> None:
    """A real header (name -> dtype, shape, bytes) and a data region left unwritten."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        f.truncate(8 + len(raw) + offset)


def test_the_index_total_size_wins_over_the_arithmetic(tmp_path: Path) -> None:
    d = _dir(tmp_path, MAVERICK)
    arithmetic = load_spec(d).weight_bytes
    assert arithmetic is not None and load_spec(d).weights_source == "arithmetic"
    _index(d, 801_000_000_000)  # the shards are not downloaded yet: the index alone states the size
    spec = load_spec(d)
    assert (spec.weights_source, spec.weight_bytes, spec.arithmetic_bytes) == ("index", 801_000_000_000, arithmetic)
    assert spec.weights_check is None  # 0.3 % from the arithmetic


def test_a_disagreement_over_3_percent_is_a_warning_naming_both_figures(tmp_path: Path) -> None:
    d = _dir(tmp_path, MAVERICK)
    _index(d, 500_000_000_000)
    spec = load_spec(d)
    assert spec.weight_bytes == 500_000_000_000  # the checkpoint's word is still the one used
    assert spec.weights_check is not None
    assert "500.0 GB" in spec.weights_check and f"{(spec.arithmetic_bytes or 0) / 1e9:.1f} GB" in spec.weights_check


def test_an_mtp_layer_in_the_checkpoint_is_no_disagreement(tmp_path: Path) -> None:
    cfg = {"hidden_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 8,
           "vocab_size": 1000, "intermediate_size": 2048, "torch_dtype": "bfloat16"}
    plain = load_spec(_dir(tmp_path, cfg, "plain"))
    assert plain.params_total is not None
    mtp_layer = 4 * 512 * 512 + 3 * 512 * 2048 + 2 * 512 * 512  # one more decoder layer + its 2h -> h projection
    with_mtp = 2 * (plain.params_total + mtp_layer)
    d = _dir(tmp_path, {**cfg, "num_nextn_predict_layers": 1}, "mtp")
    _index(d, with_mtp)
    assert load_spec(d).weights_check is None
    d = _dir(tmp_path, cfg, "no-mtp")
    _index(d, with_mtp)
    assert load_spec(d).weights_check is not None  # the same bytes without an MTP layer in the config


def test_the_index_wins_over_the_headers_of_shards_present(tmp_path: Path) -> None:
    d = _dir(tmp_path, MAVERICK)
    save_file({"w": np.zeros((4, 4), dtype=np.float16)}, str(d / "model-00001-of-00001.safetensors"))
    _index(d, 801_000_000_000)
    assert (load_spec(d).weights_source, load_spec(d).weight_bytes) == ("index", 801_000_000_000)


def test_safetensors_headers_without_an_index(tmp_path: Path) -> None:
    cfg = json.loads((MODELS / "llama-3-8b" / "config.json").read_text())
    d = _dir(tmp_path, cfg)
    a = {"embed": np.zeros((128, 64), dtype=np.float16), "norm": np.zeros(64, dtype=np.float32)}
    b = {"lm_head": np.zeros((128, 64), dtype=np.float16)}
    save_file(a, str(d / "model-00001-of-00002.safetensors"))
    save_file(b, str(d / "model-00002-of-00002.safetensors"))
    spec = load_spec(d)
    data = sum(x.nbytes for x in (*a.values(), *b.values()))
    assert spec.weights_source == "safetensors_headers" and spec.weight_bytes == data
    files = sum(p.stat().st_size for p in d.glob("*.safetensors"))
    assert files > data  # the headers themselves are not weights
    assert spec.weights_check is not None and "safetensors headers" in spec.weights_check  # toy tensors vs 8B


def test_only_the_header_is_read(tmp_path: Path) -> None:
    f = tmp_path / "model.safetensors"
    # 16 GB of bf16 tensors declared, none written: a sparse file, as mid-download
    _sparse_safetensors(f, {"model.embed_tokens.weight": ("BF16", [128256, 4096], 128256 * 4096 * 2),
                            "model.layers.0.mlp.up_proj.weight": ("BF16", [14336, 4096], 14336 * 4096 * 2)})
    assert safetensors_data_bytes(f) == 2 * (128256 + 14336) * 4096


@pytest.mark.parametrize(
    "content,match",
    [(b"", "shorter than"), (b"\xff" * 8 + b"{}", "does not fit"), ((5).to_bytes(8, "little") + b"nope!", "not JSON"),
     ((2).to_bytes(8, "little") + b"[]", "not a JSON object"),
     ((14).to_bytes(8, "little") + b'{"w": {"a":1}}', "no data_offsets")],
)
def test_a_bad_header_is_named(tmp_path: Path, content: bytes, match: str) -> None:
    f = tmp_path / "x.safetensors"
    f.write_bytes(content)
    with pytest.raises(HeaderError, match=match):
        safetensors_data_bytes(f)


def test_an_unreadable_header_falls_back_to_file_sizes_and_says_so(tmp_path: Path) -> None:
    d = _dir(tmp_path, json.loads((MODELS / "llama-3-8b" / "config.json").read_text()))
    (d / "model.safetensors").write_bytes(b"\0" * 1000)
    spec = load_spec(d)
    assert (spec.weights_source, spec.weight_bytes) == ("file_sizes", 1000)
    assert any("safetensors header did not read" in n for n in spec.notes)


def test_pytorch_bin_files_are_sized_on_disk(tmp_path: Path) -> None:
    d = _dir(tmp_path, json.loads((MODELS / "llama-3-8b" / "config.json").read_text()))
    (d / "pytorch_model.bin").write_bytes(b"\0" * 2000)
    assert (load_spec(d).weights_source, load_spec(d).weight_bytes) == ("file_sizes", 2000)


# ---------------------------------------------------------------- GGUF: the tensor table


def _gguf(path: Path, arch: str, fields: dict[str, Any], tensors: list[tuple[str, tuple[int, ...]]]) -> Path:
    w = gguf.GGUFWriter(path, arch)
    for key, value in fields.items():
        if isinstance(value, list):
            w.add_array(f"{arch}.{key}", value)
        else:
            w.add_uint32(f"{arch}.{key}", value)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for name, shape in tensors:
        n = int(np.prod(shape))
        w.add_tensor_info(name, shape, np.dtype(np.float16), n * 2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size + sum(int(np.prod(s)) * 2 for _, s in tensors))
    return path


def _llama4_tensors(layers: int, h: int, ffn: int, ffn_dense: int, experts: int) -> list[tuple[str, tuple[int, ...]]]:
    t: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (100, h)), ("output.weight", (100, h))]
    for i in range(layers):
        t += [(f"blk.{i}.attn_q.weight", (h, h)), (f"blk.{i}.attn_k.weight", (h // 4, h)),
              (f"blk.{i}.attn_v.weight", (h // 4, h)), (f"blk.{i}.attn_output.weight", (h, h))]
        if i % 2:  # llama.cpp's names: routed experts stacked in *_exps, the shared expert in *_shexp
            t += [(f"blk.{i}.ffn_{p}_exps.weight", (experts, ffn, h)) for p in ("gate", "up", "down")]
            t += [(f"blk.{i}.ffn_{p}_shexp.weight", (ffn, h)) for p in ("gate", "up", "down")]
            t += [(f"blk.{i}.ffn_gate_inp.weight", (experts, h))]
        else:
            t += [(f"blk.{i}.ffn_{p}.weight", (ffn_dense, h)) for p in ("gate", "up", "down")]
    return t


def test_gguf_interleaved_experts_are_counted_from_the_tensor_table(tmp_path: Path) -> None:
    h, ffn, dense, experts = 64, 32, 128, 8
    tensors = _llama4_tensors(4, h, ffn, dense, experts)
    fields = {"block_count": 4, "embedding_length": h, "attention.head_count": 4, "attention.head_count_kv": 1,
              "context_length": 4096, "expert_count": experts, "expert_used_count": 1}
    spec = load_spec(_gguf(tmp_path / "llama4.gguf", "llama4", fields, tensors))
    total = sum(int(np.prod(s)) for _, s in tensors)
    routed = 2 * experts * 3 * ffn * h
    assert spec.params_total == total and spec.params_active == total - routed + routed // experts
    assert (spec.weights_source, spec.moe_layers, spec.family) == ("gguf", 2, "moe")
    assert (spec.sliding_layers, spec.sliding_window) == (3, 8192)  # llama.cpp: chunked attention, 3 of 4
    no_chunks = _gguf(tmp_path / "llama4-no-chunks.gguf", "llama4", {**fields, "attention.sliding_window": 0}, tensors)
    assert (load_spec(no_chunks).sliding_layers, load_spec(no_chunks).sliding_window) == (0, None)


def test_gguf_blocks_without_attention_tensors_are_recurrent(tmp_path: Path) -> None:
    h = 64
    tensors: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (100, h))]
    for i in range(4):
        if i == 3:
            tensors += [(f"blk.{i}.attn_{p}.weight", (h, h)) for p in ("q", "k", "v", "output")]
        else:  # a linear-attention / SSM block: no K projection
            tensors += [(f"blk.{i}.ssm_in.weight", (2 * h, h)), (f"blk.{i}.ssm_out.weight", (h, h))]
        tensors += [(f"blk.{i}.ffn_{p}.weight", (128, h)) for p in ("gate", "up", "down")]
    fields = {"block_count": 4, "embedding_length": h, "attention.head_count": 4, "attention.head_count_kv": 4}
    spec = load_spec(_gguf(tmp_path / "hybrid.gguf", "qwen3next", fields, tensors))
    assert (spec.ssm_layers, spec.family) == (3, "hybrid")


def test_a_llama_cpp_projector_beside_the_model_is_counted(tmp_path: Path) -> None:
    h = 64
    tensors = [("token_embd.weight", (100, h))] + [
        (f"blk.0.{n}.weight", (h, h)) for n in ("attn_q", "attn_k", "attn_v", "attn_output")
    ]
    fields = {"block_count": 1, "embedding_length": h, "attention.head_count": 4, "attention.head_count_kv": 4}
    model = _gguf(tmp_path / "gemma-3-4b-it-F16.gguf", "gemma3", fields, tensors)
    text_only = load_spec(model)
    projector = _gguf(tmp_path / "mmproj-F16.gguf", "clip", {}, [("v.blk.0.attn_q.weight", (256, 256))])
    spec = load_spec(model)
    assert spec.vision_params == 256 * 256 and spec.params_total == (text_only.params_total or 0) + 256 * 256
    assert spec.file_bytes == model.stat().st_size + projector.stat().st_size
    assert spec.family == "multimodal" and any("--mmproj" in n for n in spec.notes)
    assert spec.params_active == text_only.params_active  # images only: not read per token
    assert load_spec(tmp_path) == spec  # the directory: the model, not the projector, is the one loaded


def test_a_checkpoint_still_downloading_is_not_sized_by_the_shards_present(tmp_path: Path) -> None:
    d = _dir(tmp_path, json.loads((MODELS / "llama-3-8b" / "config.json").read_text()))
    save_file({"w": np.zeros((4, 4), dtype=np.float16)}, str(d / "model-00001-of-00004.safetensors"))
    spec = load_spec(d)  # 1 of 4 shards, no index: 32 bytes would be a tiny model
    assert spec.weights_source == "arithmetic" and spec.weight_bytes == spec.arithmetic_bytes
    assert any("3 weight file(s) of the checkpoint are not on disk (model-00002-of-00004.safetensors" in n
               for n in spec.notes)
    _index(d, None, tuple(f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)))  # an index without total_size
    assert load_spec(d).weights_source == "arithmetic"


@pytest.mark.parametrize("index", ["[1, 2]", '{"metadata": {"total_size": "801 GB"}}', '{"metadata": null}', "{nope"])
def test_an_index_that_states_no_usable_total_is_not_trusted(tmp_path: Path, index: str) -> None:
    d = _dir(tmp_path, MAVERICK)
    (d / "model.safetensors.index.json").write_text(index)
    spec = load_spec(d)
    assert spec.weights_source == "arithmetic" and spec.weight_bytes == spec.arithmetic_bytes


def test_a_config_value_the_arithmetic_cannot_read_is_a_spec_error(tmp_path: Path) -> None:
    from gateway.planning import SpecError

    d = _dir(tmp_path, {**MAVERICK, "text_config": {**MAVERICK["text_config"], "interleave_moe_layer_step": "two"}})
    with pytest.raises(SpecError, match="the layer arithmetic cannot read this config"):
        load_spec(d)


def test_an_index_naming_files_outside_its_directory_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.safetensors"
    save_file({"w": np.zeros((64, 64), dtype=np.float16)}, str(outside))
    d = _dir(tmp_path, json.loads((MODELS / "llama-3-8b" / "config.json").read_text()))
    _index(d, None, ("../elsewhere.safetensors", str(outside)))
    spec = load_spec(d)
    assert spec.weights_source == "arithmetic" and spec.weight_bytes == spec.arithmetic_bytes
