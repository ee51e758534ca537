from pathlib import Path

import gguf
import numpy as np
import pytest

from gateway.planning import load_spec
from gateway.planning.gguf_meta import SMALL_ARRAY, GgufFormatError, read_gguf_meta
from tests.unit.hosts import embedded_gguf, embedded_reader


def test_scan_agrees_with_gguf_reader_on_the_embedded_model() -> None:
    path = embedded_gguf()
    meta = read_gguf_meta(path)
    reader = embedded_reader()
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        expected = field.contents()
        if isinstance(expected, list) and len(expected) > SMALL_ARRAY:
            assert meta.fields[key] is None  # skipped, not decoded
        else:
            assert (
                meta.fields[key] == pytest.approx(expected)
                if isinstance(expected, float)
                else meta.fields[key] == expected
            )
    assert [(t.name, t.n_elements, t.n_bytes) for t in meta.tensors] == [
        (t.name, int(t.n_elements), int(t.n_bytes)) for t in reader.tensors
    ]


def _write_moe(path: Path) -> None:
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_block_count(2)
    w.add_context_length(4096)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_expert_count(8)
    w.add_expert_used_count(2)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_token_list([f"t{i}" for i in range(SMALL_ARRAY + 500)])  # long enough to be skipped
    w.add_tensor("token_embd.weight", np.zeros((100, 64), dtype=np.float32))
    for b in range(2):
        w.add_tensor(f"blk.{b}.attn_q.weight", np.zeros((64, 64), dtype=np.float32))
        w.add_tensor(f"blk.{b}.ffn_up_exps.weight", np.zeros((8, 32, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_moe_gguf_written_by_the_gguf_package(tmp_path: Path) -> None:
    f = tmp_path / "moe.gguf"
    _write_moe(f)
    s = load_spec(f)
    assert (s.architecture, s.family, s.experts, s.experts_used) == ("qwen3moe", "moe", 8, 2)
    # 6,400 embedding + 2 x 4,096 attention + 2 x 16,384 expert params (8 experts x 32 x 64)
    assert s.params_total == 6400 + 2 * 4096 + 2 * 16384
    # active: only 2 of 8 experts -> expert params x 2/8
    assert s.params_active == 6400 + 2 * 4096 + 2 * 16384 * 2 // 8
    assert s.bits_per_weight == 32.0 and s.head_dim == 16


def test_not_a_gguf(tmp_path: Path) -> None:
    f = tmp_path / "x.gguf"
    f.write_bytes(b"GGML" + b"\0" * 64)
    with pytest.raises(GgufFormatError, match="magic"):
        read_gguf_meta(f)
    f.write_bytes(b"GGUF\x03\0\0\0" + b"\x05" + b"\0" * 3)
    with pytest.raises(GgufFormatError, match="truncated"):
        read_gguf_meta(f)


def test_mla_gguf_from_deepseek2_metadata(tmp_path: Path) -> None:
    f = tmp_path / "mla.gguf"
    w = gguf.GGUFWriter(str(f), "deepseek2")
    w.add_block_count(2)
    w.add_context_length(4096)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_uint32("deepseek2.attention.kv_lora_rank", 16)
    w.add_rope_dimension_count(8)
    w.add_tensor("token_embd.weight", np.zeros((10, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    s = load_spec(f)
    assert (s.attention, s.kv_lora_rank, s.qk_rope_head_dim) == ("mla", 16, 8)
    from gateway.planning import kv_bytes_per_token

    # (16 + 8) x 2 layers x 2 bytes = 96 bytes per token
    assert kv_bytes_per_token(s, "fp16") == (96, 0)
