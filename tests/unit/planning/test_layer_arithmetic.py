"""Layer-by-layer model arithmetic (gateway/planning/stack) against the totals the models' publishers state.

The configs are the published config.json files (tests/fixtures/models, keys as the model repositories
ship them); the totals and active counts are the ones on the model cards and in the papers. Each
computed count must be within 3 % of the published one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.planning import ModelSpec, kv_bytes, kv_bytes_per_token, load_spec
from gateway.planning.stack import count, layer_list
from tests.unit.hosts import MODELS


@dataclass(frozen=True)
class Published:
    fixture: str
    total: float
    active: float | None
    where: str


PUBLISHED = [
    Published("llama-4-maverick", 400e9, 17e9, "Llama 4 model card: 17B active, 400B total (128 experts)"),
    Published("llama-4-scout", 109e9, 17e9, "Llama 4 model card: 17B active, 109B total (16 experts)"),
    Published("jamba-v0.1", 52e9, 12e9, "Jamba card and paper: 52B total, 12B active"),
    Published("jamba-1.5-large", 398e9, 94e9, "Jamba 1.5 card: Large 398B total, 94B active (72 layers, 9 attend)"),
    Published("qwen1.5-moe-a2.7b", 14.3e9, 2.7e9, "Qwen1.5-MoE-A2.7B card: 14.3B total, 2.7B activated"),
    Published("qwen2-57b-a14b", 57e9, 14e9, "Qwen2 report: 57B total, 14B activated"),
    Published("deepseek-v3", 671e9, 37e9, "DeepSeek-V3 report: 671B total (MTP module not counted), 37B activated"),
    # "A3B" names the activated count rounded: 3.9B with embeddings and lm_head, 3.2B without; the card's "3B"
    # is not precise enough to hold a count to 3 %, so only the total is checked
    Published("qwen3-next-80b-a3b", 80e9, None, "Qwen3-Next card: 80B total, 3B activated"),
    Published("qwen2.5-vl-7b", 8.29e9, None, "Qwen2.5-VL-7B-Instruct checkpoint: 8.29B (7.6B language model + ViT)"),
    Published("llama-3.2-11b-vision", 10.6e9, None, "Llama 3.2 Vision model card: 11B (10.6B)"),
    Published("mixtral-8x7b", 46.7e9, 12.9e9, "Mixtral paper: 47B total (46.7B), 13B active (12.9B)"),
    Published("llama-3-8b", 8.03e9, 8.03e9, "Llama 3 8B: 8.03B"),
    Published("qwen3-30b-a3b", 30.5e9, 3.3e9, "Qwen3-30B-A3B card: 30.5B total, 3.3B activated"),
]


@pytest.mark.parametrize("row", PUBLISHED, ids=[r.fixture for r in PUBLISHED])
def test_computed_parameters_are_within_3_percent_of_the_published(row: Published) -> None:
    spec = load_spec(MODELS / row.fixture)
    assert spec.params_total is not None and spec.params_active is not None
    assert abs(spec.params_total - row.total) / row.total <= 0.03, (spec.params_total, row.where)
    if row.active is not None:
        assert abs(spec.params_active - row.active) / row.active <= 0.03, (spec.params_active, row.where)
    assert spec.weights_source == "arithmetic" and spec.weight_bytes == spec.arithmetic_bytes


def _layers(name: str) -> list[tuple[str, str, int]]:
    spec = load_spec(MODELS / name)
    cfg = json.loads((MODELS / name / "config.json").read_text())
    text = {**cfg, **cfg.get("text_config", {})}
    assert spec.layers == len(layer_list(text).layers)
    return [(layer.mixer, layer.mlp, layer.mlp_size) for layer in layer_list(text).layers]


def test_llama_4_maverick_holds_experts_in_every_other_layer_with_dense_mlps_between() -> None:
    layers = _layers("llama-4-maverick")
    # interleave_moe_layer_step 2: layers 1, 3, ... 47 hold the 128 experts of 8192; the others a 16384 MLP
    assert [i for i, (_, mlp, _) in enumerate(layers) if mlp == "moe"] == list(range(1, 48, 2))
    assert {size for _, mlp, size in layers if mlp == "moe"} == {8192}
    assert {size for _, mlp, size in layers if mlp == "dense"} == {16384}
    # RoPE layers attend in chunks of 8192 tokens; every fourth layer (NoPE) is global
    assert [i for i, (mixer, _, _) in enumerate(layers) if mixer == "attention"] == list(range(3, 48, 4))


def test_llama_4_maverick_counted_by_hand() -> None:
    h, v = 5120, 202048
    attention = 2 * h * 40 * 128 + 2 * h * 8 * 128
    expert = 3 * h * 8192
    moe = 128 * expert + expert + h * 128  # routed + the shared expert + router
    dense = 3 * h * 16384
    text = 2 * v * h + 48 * attention + 24 * moe + 24 * dense
    spec = load_spec(MODELS / "llama-4-maverick")
    assert spec.params_total == text + spec.vision_params
    assert spec.params_active == 2 * v * h + 48 * attention + 24 * (2 * expert + h * 128) + 24 * dense
    assert 0.8e9 < spec.vision_params < 1.0e9  # 34 ViT layers of 1408 + the pixel-shuffle projector
    assert (spec.family, spec.moe_layers, spec.experts, spec.experts_used) == ("multimodal", 24, 128, 1)


def test_qwen_vl_vision_tower_is_in_the_total_not_the_active() -> None:
    spec = load_spec(MODELS / "qwen2.5-vl-7b")
    vit = 32 * (4 * 1280 * 1280 + 3 * 1280 * 3420)  # gated (SiLU) MLP
    merger = (4 * 1280) ** 2 + 4 * 1280 * 3584
    patches = 3 * 14 * 14 * 2 * 1280
    assert spec.vision_params == vit + merger + patches
    assert spec.params_total == (spec.params_active or 0) + spec.vision_params and spec.family == "multimodal"


def test_llama_3_2_vision_cross_attention_layers_hold_no_per_token_kv() -> None:
    spec = load_spec(MODELS / "llama-3.2-11b-vision")
    assert (spec.family, spec.ssm_layers) == ("multimodal", 8)
    assert kv_bytes_per_token(spec) == (32 * 2 * 8 * 128 * 2, 0)  # the 32 self-attention layers


def test_jamba_attention_and_experts_by_period_and_offset() -> None:
    layers = _layers("jamba-v0.1")
    assert [i for i, (mixer, _, _) in enumerate(layers) if mixer == "attention"] == [4, 12, 20, 28]
    assert {mixer for i, (mixer, _, _) in enumerate(layers) if i % 8 != 4} == {"mamba"}
    assert [i for i, (_, mlp, _) in enumerate(layers) if mlp == "moe"] == list(range(1, 32, 2))


def test_jamba_mamba_layer_counted_from_its_config() -> None:
    h, inner, rank, state, conv = 4096, 2 * 4096, 256, 16, 4
    mamba = h * 2 * inner + inner * conv + inner * (rank + 2 * state) + rank * inner + inner * state + inner * h
    attention = 2 * h * 4096 + 2 * h * 8 * 128
    mlp = 3 * h * 14336
    expected = 2 * 65536 * h + 28 * mamba + 4 * attention + 16 * mlp + 16 * (16 * mlp + h * 16)
    spec = load_spec(MODELS / "jamba-v0.1")
    assert spec.params_total == expected
    assert (spec.family, spec.ssm_layers, spec.moe_layers) == ("hybrid", 28, 16)


def test_jamba_kv_is_counted_in_its_four_attention_layers_only() -> None:
    spec = load_spec(MODELS / "jamba-v0.1")
    assert kv_bytes_per_token(spec) == (4 * 2 * 8 * 128 * 2, 0)


def test_deepseek_v3_first_three_layers_dense() -> None:
    layers = _layers("deepseek-v3")
    assert [mlp for _, mlp, _ in layers[:4]] == ["dense", "dense", "dense", "moe"]
    assert layers[0][2] == 18432 and layers[3][2] == 2048
    assert load_spec(MODELS / "deepseek-v3").moe_layers == 58


def test_qwen3_next_full_attention_every_fourth_layer_and_gated_deltanet_between() -> None:
    layers = _layers("qwen3-next-80b-a3b")
    assert [i for i, (mixer, _, _) in enumerate(layers) if mixer == "attention"] == list(range(3, 48, 4))
    assert {mixer for mixer, _, _ in layers} == {"attention", "linear_attention"}
    spec = load_spec(MODELS / "qwen3-next-80b-a3b")
    assert (spec.family, spec.ssm_layers) == ("hybrid", 36)
    assert kv_bytes_per_token(spec) == (12 * 2 * 2 * 256 * 2, 0)  # 12 layers x K and V x 2 heads x 256


def test_llama_4_chunked_layers_stop_growing_at_the_chunk() -> None:
    spec = load_spec(MODELS / "llama-4-maverick")
    per_layer = 2 * 8 * 128 * 2
    assert (spec.sliding_layers, spec.sliding_window) == (36, 8192)
    assert kv_bytes(spec, 100_000) == 12 * per_layer * 100_000 + 36 * per_layer * 8192


BASE = {"hidden_size": 64, "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 100, "intermediate_size": 256, "moe_intermediate_size": 32, "num_experts": 8,
        "num_experts_per_tok": 2}


@pytest.mark.parametrize(
    "extra,moe",
    [
        ({"decoder_sparse_step": 2}, [1, 3, 5, 7]),
        ({"decoder_sparse_step": 2, "mlp_only_layers": [3, 7]}, [1, 5]),
        ({"decoder_sparse_step": 1, "mlp_only_layers": [0]}, [1, 2, 3, 4, 5, 6, 7]),
        ({"first_k_dense_replace": 2, "moe_layer_freq": 2}, [2, 4, 6]),
        ({"interleave_moe_layer_step": 4}, [3, 7]),
        ({"moe_layers": [0, 5]}, [0, 5]),
        ({"expert_layer_period": 4, "expert_layer_offset": 2}, [2, 6]),
        ({"moe_layer_start_index": 1, "moe_layer_end_index": 5, "moe_layer_interval": 1}, [1, 2, 3, 4, 5]),
        ({}, list(range(8))),
    ],
    ids=["qwen-sparse-step", "qwen-mlp-only", "qwen-first-dense", "deepseek-freq", "llama4-step", "explicit-list",
         "jamba-period", "ernie-range", "every-layer"],
)
def test_which_layers_hold_experts(extra: dict[str, object], moe: list[int]) -> None:
    stack = layer_list({**BASE, **extra})
    assert [i for i, layer in enumerate(stack.layers) if layer.mlp == "moe"] == moe
    params = count({**BASE, **extra})
    attention = 2 * 64 * 4 * 16 + 2 * 64 * 2 * 16
    moe_mlp = 8 * 3 * 64 * 32 + 64 * 8
    dense_mlp = 3 * 64 * 256
    assert params.total == 2 * 100 * 64 + 8 * attention + len(moe) * moe_mlp + (8 - len(moe)) * dense_mlp


def test_shared_experts_by_each_convention() -> None:
    qwen = count({**BASE, "shared_expert_intermediate_size": 128})
    deepseek = count({**BASE, "n_shared_experts": 2})
    plain = count(BASE)
    assert qwen.total - plain.total == 8 * 3 * 64 * 128 and qwen.active - plain.active == 8 * 3 * 64 * 128
    assert deepseek.total - plain.total == 8 * 2 * 3 * 64 * 32


@pytest.mark.parametrize(
    "types,sliding,recurrent",
    [
        (["sliding_attention", "full_attention"] * 4, 4, 0),
        (["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"], 0, 6),
        (["mamba", "mamba", "mamba", "attention"] * 2, 0, 6),
    ],
    ids=["gpt-oss", "qwen3-next", "granite-4"],
)
def test_layer_types(types: list[str], sliding: int, recurrent: int) -> None:
    stack = layer_list({**BASE, "layer_types": types, "sliding_window": 128})
    assert (stack.sliding, stack.recurrent) == (sliding, recurrent)
    assert stack.window == (128 if sliding else None)


def test_a_dense_config_counts_as_before() -> None:
    # the formula the planner used before the layer list: embeddings + layers x (attention + 3 x h x intermediate)
    dense = {k: v for k, v in BASE.items() if "expert" not in k}
    attention = 2 * 64 * 4 * 16 + 2 * 64 * 2 * 16
    assert count(dense).total == count(dense).active == 2 * 100 * 64 + 8 * (attention + 3 * 64 * 256)


def test_mtp_layers_are_counted_apart() -> None:
    p = count({**BASE, "num_nextn_predict_layers": 1})
    assert p.total == count(BASE).total and p.mtp > 0


def test_spec_fields_round_trip_with_the_new_figures() -> None:
    spec = load_spec(MODELS / "llama-4-scout")
    assert ModelSpec.model_validate_json(spec.model_dump_json()) == spec
    old = spec.model_dump(exclude={"weights_source"})
    assert ModelSpec.model_validate({**old, "file_bytes": 10}).weights_source == "file_sizes"  # specs written before


NEMOTRON_H = {"model_type": "nemotron_h", "hidden_size": 256, "num_hidden_layers": 8, "num_attention_heads": 8,
              "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 1000, "intermediate_size": 1024,
              "mlp_hidden_act": "relu2", "hybrid_override_pattern": "M-M*-M-", "mamba_num_heads": 16,
              "mamba_head_dim": 32, "ssm_state_size": 64, "n_groups": 2, "conv_kernel": 4,
              "tie_word_embeddings": False}


def test_nemotron_h_blocks_are_each_one_kind() -> None:
    stack = layer_list({**NEMOTRON_H, "hybrid_override_pattern": "M-M*-M-E"})
    assert [(layer.mixer, layer.mlp) for layer in stack.layers[:4]] == [
        ("mamba", "none"), ("none", "dense"), ("mamba", "none"), ("attention", "none")]
    assert stack.recurrent == 7  # every block but the attention one holds no per-token KV
    h, inner, groups, state = 256, 16 * 32, 2, 64
    mamba2 = h * (2 * inner + 2 * groups * state + 16) + (inner + 2 * groups * state) * 4 + inner * h
    attention = h * 8 * 32 * 2 + 2 * h * 2 * 32
    mlp = 2 * h * 1024  # squared ReLU: up and down only
    cfg = {**NEMOTRON_H, "num_hidden_layers": 7}
    assert count(cfg).total == 2 * 1000 * h + 3 * mamba2 + attention + 3 * mlp
    with pytest.raises(ValueError, match="7 blocks, num_hidden_layers 8"):
        layer_list(NEMOTRON_H)
    with pytest.raises(ValueError, match=r"block types \['\?'\]"):
        layer_list({**cfg, "hybrid_override_pattern": "M-M*-M?"})


def test_nemotron_h_kv_counts_its_attention_blocks_only(tmp_path: Path) -> None:
    d = tmp_path / "nemotron-h"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**NEMOTRON_H, "num_hidden_layers": 7, "torch_dtype": "bfloat16"}))
    spec = load_spec(d)
    assert (spec.family, spec.ssm_layers) == ("hybrid", 6)
    assert kv_bytes_per_token(spec) == (1 * 2 * 2 * 32 * 2, 0)


def test_a_quantised_multimodal_checkpoint_keeps_its_vision_tower_at_16_bits(tmp_path: Path) -> None:
    cfg = json.loads((MODELS / "qwen2.5-vl-7b" / "config.json").read_text())
    d = tmp_path / "awq"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**cfg, "quantization_config": {"quant_method": "awq", "bits": 4,
                                                                               "group_size": 128}}))
    spec = load_spec(d)
    embeddings = 2 * 152064 * 3584
    assert spec.unquantized_params == embeddings + spec.vision_params
