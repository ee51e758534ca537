"""Model files in each layout engines load today, sized as they sit in memory; and the hardware table."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.hardware.figures import figures_for, load_table, near_match
from gateway.planning import SpecError, load_spec
from tests.unit.planning.snapshots import GPT_OSS_120B, LLAMA_70B, QUANT_CONFIGS, hf_dir, synthetic_gguf

# Llama-3-70B: 70,552,387,584 parameters, of which embeddings + lm_head 2 x 128,256 x 8,192 stay 16-bit
TOTAL = 70_552_387_584
EMBED = 2 * 128_256 * 8_192
QUANTISED = TOTAL - EMBED

LAYOUTS = [
    # (config, format, bits per quantised weight, label)
    ("compressed-tensors-fp8", "fp8", 8.0, "compressed-tensors W8A8-FP8"),
    ("compressed-tensors-w4a16", "compressed-tensors", 4 + 16 / 128, "compressed-tensors W4A16 int g128"),
    ("compressed-tensors-nvfp4", "nvfp4", 4.5, "compressed-tensors NVFP4"),
    ("fbgemm-fp8", "fp8", 8.0, "fbgemm FP8"),
    ("fp8-block", "fp8", 8.0, "fp8"),
    ("modelopt-fp8", "fp8", 8.0, "modelopt FP8"),
    ("gptq-g128-desc-act", "gptq", 4 + 20 / 128, "4-bit g128"),
    ("gptq-per-channel-8bit", "gptq", 8.0, "8-bit per-channel"),
    ("awq-gemm", "awq", 4 + 20 / 128, "4-bit g128 gemm"),
    ("awq-legacy-keys", "awq", 4 + 20 / 64, "4-bit g64 gemv"),
    ("bnb-nf4-double", "bnb", 4 + 8 / 64 + 32 / (64 * 256), "bnb nf4 double-quant"),
    ("bnb-int8", "bnb", 8.0, "bnb int8"),
]


@pytest.mark.parametrize("name,fmt,bits,label", LAYOUTS, ids=[x[0] for x in LAYOUTS])
def test_quantisation_layouts_are_sized_as_loaded(tmp_path: Path, name: str, fmt: str, bits: float, label: str) -> None:
    spec = load_spec(hf_dir(tmp_path, name, {**LLAMA_70B, "quantization_config": QUANT_CONFIGS[name]}))
    assert (spec.format, spec.quantization) == (fmt, label)
    assert spec.bits_per_weight == pytest.approx(bits, abs=1e-4)
    assert spec.params_total == TOTAL and spec.unquantized_params == EMBED
    expected = QUANTISED * spec.bits_per_weight / 8 + EMBED * 2
    assert spec.weight_bytes == pytest.approx(expected, abs=1)


def test_fp8_checkpoints_are_not_read_as_bf16(tmp_path: Path) -> None:
    fp8 = load_spec(hf_dir(tmp_path, "fp8", {**LLAMA_70B, "quantization_config": QUANT_CONFIGS["compressed-tensors-fp8"]}))
    bf16 = load_spec(hf_dir(tmp_path, "bf16", LLAMA_70B))
    assert bf16.weight_bytes == 2 * TOTAL
    assert 0.5 < (fp8.weight_bytes or 0) / (bf16.weight_bytes or 1) < 0.52  # embeddings stay 16-bit


def test_modelopt_side_file_nvfp4(tmp_path: Path) -> None:
    side = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4", "group_size": 16}}
    spec = load_spec(hf_dir(tmp_path, "nvfp4", LLAMA_70B, {"hf_quant_config.json": side}))
    assert (spec.format, spec.bits_per_weight, spec.quantization) == ("nvfp4", 4.5, "modelopt NVFP4")


def test_mxfp4_quantises_only_the_experts(tmp_path: Path) -> None:
    spec = load_spec(hf_dir(tmp_path, "gpt-oss", GPT_OSS_120B))
    assert spec.format == "mxfp4" and spec.family == "moe"
    # 36 layers x 128 experts x 3 x 2,880 x 2,880 expert weights at 4.25 bits, the rest bf16
    experts = 36 * 128 * 3 * 2880 * 2880
    assert spec.unquantized_params == (spec.params_total or 0) - experts
    assert spec.weight_bytes == int(experts * 4.25 / 8 + spec.unquantized_params * 2)
    assert 60e9 < (spec.weight_bytes or 0) < 70e9  # the published checkpoint is ~65 GB


def test_unknown_quantisation_is_named(tmp_path: Path) -> None:
    spec = load_spec(hf_dir(tmp_path, "hqq", {**LLAMA_70B, "quantization_config": {"quant_method": "hqq"}}))
    assert spec.format == "unknown" and any("'hqq' is not known" in n for n in spec.notes)


def test_no_torch_dtype_is_assumed_bf16_and_said(tmp_path: Path) -> None:
    cfg = {k: v for k, v in LLAMA_70B.items() if k != "torch_dtype"}
    spec = load_spec(hf_dir(tmp_path, "nodtype", cfg))
    assert spec.format == "bf16" and any("assumed bf16" in n for n in spec.notes)


def test_duplicate_weight_files_are_not_counted_twice(tmp_path: Path) -> None:
    d = hf_dir(tmp_path, "dup", LLAMA_70B)
    (d / "model-00001-of-00002.safetensors").write_bytes(b"\0" * 600)
    (d / "model-00002-of-00002.safetensors").write_bytes(b"\0" * 400)
    (d / "consolidated.safetensors").write_bytes(b"\0" * 1000)
    (d / "pytorch_model.bin").write_bytes(b"\0" * 2000)
    (d / "model.safetensors.index.json").write_text(
        '{"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}'
    )
    assert load_spec(d).weight_bytes == 1000


# ---------------------------------------------------------------- split GGUF


def test_split_gguf_is_summed_over_every_shard(tmp_path: Path) -> None:
    shards = synthetic_gguf(tmp_path / "llama-70b-Q4_K.gguf", 80, 8192, 28672, 64, 8, 128256, shards=3)
    assert [p.name for p in shards] == [f"llama-70b-Q4_K-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    spec = load_spec(shards[0])
    sizes = [os.path.getsize(p) for p in shards]
    assert spec.file_bytes == sum(sizes) and sizes[0] < sum(sizes) / 2
    assert spec.params_total == TOTAL  # every tensor of every shard
    assert spec.bits_per_weight == 4.5  # Q4_K: 144 bytes per 256 weights
    assert spec.weight_bytes and 39e9 < spec.weight_bytes < 40e9
    assert load_spec(shards[1]) == spec  # any shard names the whole model
    assert load_spec(tmp_path) == spec  # a directory holding one split model


def test_a_missing_shard_is_an_error_not_a_small_model(tmp_path: Path) -> None:
    shards = synthetic_gguf(tmp_path / "m.gguf", 4, 256, 512, 4, 2, 1000, shards=3)
    shards[2].unlink()
    with pytest.raises(SpecError, match="split GGUF of 3 shards, missing m-00003-of-00003.gguf"):
        load_spec(shards[0])


# ---------------------------------------------------------------- hardware table

CURRENT_PARTS = [
    ("NVIDIA H200", 4800, 141),
    ("NVIDIA H200 NVL", 4800, 141),
    ("NVIDIA B200", 8000, 180),
    ("NVIDIA GB200", 8000, 186),
    ("NVIDIA L40S", 864, 48),
    ("NVIDIA GeForce RTX 5090", 1792, 32),
    ("NVIDIA GeForce RTX 5080", 960, 16),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 1792, 96),
    ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", 1792, 96),
    ("AMD Instinct MI325X", 6000, 256),
    ("AMD Instinct MI355X", 8000, 288),
    ("AMD Instinct MI300X", 5300, 192),
    ("Apple M3 Pro", 150, None),
    ("Apple M3 Max", 400, None),
    ("Apple M3 Ultra", 819, None),
    ("Apple M4 Pro", 273, None),
    ("Apple M4 Max", 546, None),
    ("NVIDIA Jetson AGX Orin", 204.8, None),
    ("NVIDIA Jetson Orin NX", 102.4, None),
    ("NVIDIA Jetson Orin Nano", 68, None),
]


@pytest.mark.parametrize("name,bandwidth,memory", CURRENT_PARTS, ids=[x[0] for x in CURRENT_PARTS])
def test_current_parts_have_datasheet_figures(name: str, bandwidth: float, memory: float | None) -> None:
    f = figures_for(name)
    assert f.memory_bandwidth_gbps == bandwidth and f.memory_gb == memory and f.source


@pytest.mark.parametrize(
    "name,near",
    [
        ("NVIDIA GeForce RTX 3060 Ti", "rtx 3060"),
        ("NVIDIA GeForce RTX 4090 Laptop GPU", "rtx 4090"),
        ("NVIDIA GeForce RTX 5080 SUPER", "rtx 5080"),
        ("Apple M2 Ultra", None),  # an exact match: "Apple M2" followed by "Ultra" is not consulted
        ("Apple M5 Max", "apple m5"),
        ("NVIDIA A10G", None),  # no whole-word match at all: simply unknown
        ("NVIDIA A100-PCIE-40GB", None),
    ],
)
def test_variants_do_not_take_another_parts_figures(name: str, near: str | None) -> None:
    assert near_match(name) == near
    if near:
        assert figures_for(name).memory_bandwidth_gbps is None


def test_rtx_3090_ti_is_not_a_3090() -> None:
    assert figures_for("NVIDIA GeForce RTX 3090 Ti").memory_bandwidth_gbps == 1008
    assert figures_for("NVIDIA GeForce RTX 3090").memory_bandwidth_gbps == 936
    assert figures_for("NVIDIA A100-SXM4-80GB").memory_bandwidth_gbps == 2039  # "A10" is not a word of it


def test_apple_binned_chips_take_their_own_bandwidth() -> None:
    assert figures_for("Apple M4 Max", gpu_cores=32).memory_bandwidth_gbps == 410
    assert figures_for("Apple M4 Max", gpu_cores=40).memory_bandwidth_gbps == 546
    assert figures_for("Apple M3 Max", gpu_cores=30).memory_bandwidth_gbps == 300


def test_every_row_names_its_source() -> None:
    assert all(f.source for _, f in load_table())


def test_moe_tokens_read_the_16_bit_parts_in_full(tmp_path: Path) -> None:
    spec = load_spec(hf_dir(tmp_path, "gpt-oss", GPT_OSS_120B))
    kept, total, active = spec.unquantized_params, spec.params_total or 0, spec.params_active or 0
    # attention, router and embeddings (bf16) every token; 4 of 128 experts at 4.25 bits
    expected = kept * 2 + (active - kept) * 4.25 / 8
    assert spec.active_weight_bytes == pytest.approx(expected, rel=1e-6)
    assert 4e9 < (spec.active_weight_bytes or 0) < 7e9  # the input embedding counted in full: an upper bound
