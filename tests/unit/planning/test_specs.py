import json
from pathlib import Path

import pytest

from gateway.planning import ModelSpec, SpecError, load_spec
from tests.unit.hosts import MODELS, embedded_gguf, embedded_reader


def test_embedded_smollm2_gguf_read_for_real() -> None:
    path = embedded_gguf()
    spec = load_spec(path)
    reader = embedded_reader()
    assert spec.format == "gguf" and spec.architecture == "llama"
    assert spec.layers == reader.fields["llama.block_count"].contents()
    assert spec.kv_heads == reader.fields["llama.attention.head_count_kv"].contents()
    assert spec.context_length == reader.fields["llama.context_length"].contents()
    assert spec.head_dim == spec.hidden_size // spec.attention_heads  # no key_length field: hidden / heads
    assert spec.params_total == sum(int(t.n_elements) for t in reader.tensors)
    assert spec.file_bytes == path.stat().st_size and spec.weight_bytes == spec.file_bytes
    assert spec.quantization == "Q4_1" and spec.family == "dense"


def _p(name: str) -> ModelSpec:
    return load_spec(MODELS / name)


def test_llama_3_8b_parameters() -> None:
    s = _p("llama-3-8b")
    # per layer: attention 4096*4096*2 + 2*4096*1024 = 41,943,040; MLP 3*4096*14336 = 176,160,768
    # 32 layers -> 6,979,321,856; embeddings (untied) 2*128256*4096 = 1,050,673,152
    assert s.params_total == 8_029_995_008 and s.params_active == s.params_total
    assert s.format == "bf16" and s.weight_bytes == 2 * 8_029_995_008


def test_llama_3_70b_parameters() -> None:
    # attention 2*8192*8192 + 2*8192*1024 = 150,994,944; MLP 3*8192*28672 = 704,643,072; x80
    # = 68,451,041,280; + embeddings 2*128256*8192 = 2,101,346,304
    assert _p("llama-3-70b").params_total == 70_552_387_584


def test_mixtral_total_and_active() -> None:
    s = _p("mixtral-8x7b")
    # per layer: attention 41,943,040 + 8 experts * 176,160,768 + router 4096*8 = 1,451,261,952 (x32)
    # active: 2 experts instead of 8; embeddings 2*32000*4096 = 262,144,000
    assert s.family == "moe" and (s.experts, s.experts_used) == (8, 2)
    assert s.params_total == 32 * 1_451_261_952 + 262_144_000 == 46_702_526_464
    assert s.params_active == 32 * (41_943_040 + 2 * 176_160_768 + 32_768) + 262_144_000


def test_deepseek_v3_mla_moe_fp8() -> None:
    s = _p("deepseek-v3")
    assert s.format == "fp8" and s.attention == "mla" and s.family == "moe"
    assert (s.kv_lora_rank, s.qk_rope_head_dim) == (512, 64)
    assert 670e9 < s.params_total < 672e9  # the published 671B (without the MTP layer)
    assert 37e9 < s.params_active < 38e9  # the published 37B activated
    # one byte per FP8 weight; embeddings and lm_head stay bf16: 2 x 129,280 x 7,168 params x 2 bytes
    embeddings = 2 * 129_280 * 7_168
    assert s.unquantized_params == embeddings
    assert s.weight_bytes == s.params_total - embeddings + 2 * embeddings


def test_qwen3_30b_a3b() -> None:
    s = _p("qwen3-30b-a3b")
    assert (s.experts, s.experts_used, s.head_dim) == (128, 8, 128)
    assert 30.4e9 < s.params_total < 30.6e9 and 3.3e9 < s.params_active < 3.4e9


def test_gemma_2_sliding_window_layers_and_tied_embeddings() -> None:
    s = _p("gemma-2-9b")
    assert (s.sliding_window, s.sliding_layers) == (4096, 21)
    # attention 3*3584*4096 + 2*3584*2048... = 44,040,192; MLP 154,140,672; x42 + 256000*3584 (tied)
    assert s.params_total == 42 * (44_040_192 + 154_140_672) + 256_000 * 3584


def test_quantised_formats() -> None:
    exl2, exl3, mlx = _p("llama-3-8b-exl2"), _p("llama-3-8b-exl3"), _p("llama-3-70b-mlx-4bit")
    assert (exl2.format, exl2.bits_per_weight, exl2.quantization) == ("exl2", 4.65, "4.65 bpw")
    assert (exl3.format, exl3.bits_per_weight) == ("exl3", 4.0)
    assert exl3.weight_bytes == exl3.params_total // 2
    assert (mlx.format, mlx.bits_per_weight) == ("mlx", 4.5)  # 4 bits + fp16 scale and bias per 64


def test_awq_gptq_and_hybrid(tmp_path: Path) -> None:
    base = json.loads((MODELS / "llama-3-8b" / "config.json").read_text())
    awq = tmp_path / "awq"
    awq.mkdir()
    (awq / "config.json").write_text(
        json.dumps({**base, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}})
    )
    s = load_spec(awq)
    # 4 bits + a 16-bit scale and a packed 4-bit zero point per group of 128 = 4.15625
    assert (s.format, s.bits_per_weight, s.quantization) == ("awq", 4.1562, "4-bit g128")
    hybrid = tmp_path / "hybrid"
    hybrid.mkdir()
    types = ["linear_attention"] * 3 + ["full_attention"]
    (hybrid / "config.json").write_text(json.dumps({**base, "num_hidden_layers": 4, "layer_types": types}))
    h = load_spec(hybrid)
    assert (h.family, h.ssm_layers) == ("hybrid", 3)


def test_weight_files_on_disk_win_over_the_estimate(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text((MODELS / "llama-3-8b" / "config.json").read_text())
    (d / "model.safetensors").write_bytes(b"\0" * 1000)
    assert load_spec(d).weight_bytes == 1000


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda p: p, "no such file"),
        (lambda p: (p.mkdir(), p)[1], "no config.json"),
        (lambda p: (p.with_suffix(".bin").write_bytes(b"x"), p.with_suffix(".bin"))[1], "expected a .gguf"),
        (
            lambda p: (p.with_suffix(".gguf").write_bytes(b"not a gguf"), p.with_suffix(".gguf"))[1],
            "not a readable GGUF",
        ),
    ],
)
def test_bad_paths_give_clear_errors(tmp_path: Path, make, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SpecError, match=match):
        load_spec(make(tmp_path / "model"))


def test_a_spec_json_round_trips_through_load_spec(tmp_path: Path) -> None:
    spec = load_spec(MODELS / "deepseek-v3")
    f = tmp_path / "deepseek.json"
    f.write_text(spec.model_dump_json())
    assert load_spec(f) == spec
    f.write_text('{"not": "a spec"}')
    with pytest.raises(SpecError, match="ModelSpec JSON"):
        load_spec(f)


def test_multi_token_prediction_layers_are_read_from_the_config() -> None:
    assert load_spec(MODELS / "deepseek-v3").mtp_layers == 1  # num_nextn_predict_layers
    assert load_spec(MODELS / "llama-3-8b").mtp_layers == 0
