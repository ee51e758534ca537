import pytest

from gateway.planning import (
    ENGINES,
    decode_tokens_per_s,
    installed_set,
    kv_bytes,
    kv_bytes_per_token,
    load_spec,
    max_concurrency,
    max_context,
    plan,
    prefill_seconds,
)
from tests.unit.hosts import MODELS, embedded_gguf, host

ALL = installed_set(set(ENGINES))


def spec(name: str):  # type: ignore[no-untyped-def]
    return load_spec(MODELS / name)


def test_llama_70b_kv_at_200k_tokens_is_about_65_gb() -> None:
    s = spec("llama-3-70b")
    # 2 (K,V) x 80 layers x 8 KV heads x 128 head_dim x 2 bytes = 327,680 bytes per token
    assert kv_bytes_per_token(s, "fp16") == (327_680, 0)
    # x 200,000 tokens = 65,536,000,000 bytes: inside the 40-80 GB band commonly quoted
    assert kv_bytes(s, 200_000, "fp16") == 65_536_000_000
    assert kv_bytes(s, 200_000, "fp8") == 32_768_000_000


def test_smollm2_kv_per_token() -> None:
    # 2 x 30 layers x 3 KV heads x 64 head_dim x 2 bytes = 23,040
    assert kv_bytes_per_token(load_spec(embedded_gguf()), "fp16") == (23_040, 0)


def test_mla_caches_the_latent_not_k_and_v() -> None:
    s = spec("deepseek-v3")
    # (kv_lora_rank 512 + rope 64) x 61 layers x 2 bytes = 70,272 bytes per token
    assert kv_bytes_per_token(s, "bf16") == (70_272, 0)
    # full MHA K and V would be 2 x 61 x 128 heads x 128 x 2 = 3,997,696: 57x more
    assert 2 * 61 * 128 * 128 * 2 // 70_272 == 56


def test_sliding_window_layers_stop_growing_at_the_window() -> None:
    s = spec("gemma-2-9b")
    per_layer = 2 * 8 * 256 * 2  # 8,192 bytes per token per layer
    assert kv_bytes_per_token(s, "fp16") == (21 * per_layer, 21 * per_layer)
    # 8,192 tokens: 21 global layers hold all of them, 21 local layers only the last 4,096
    assert kv_bytes(s, 8192, "fp16") == 21 * per_layer * 8192 + 21 * per_layer * 4096 == 2_113_929_216
    assert kv_bytes(s, 1000, "fp16") == 42 * per_layer * 1000  # under the window every layer grows


def test_quantised_kv_block_sizes() -> None:
    s = spec("llama-3-8b")
    # 2 x 32 x 8 x 128 = 65,536 elements per token; q8_0 stores 32 in 34 bytes, q4_0 in 18
    assert kv_bytes(s, 1, "q8_0") == 65_536 * 34 // 32 == 69_632
    assert kv_bytes(s, 1, "q4_0") == 65_536 * 18 // 32 == 36_864


def test_max_concurrency_and_context() -> None:
    # (80 GB - 16 GB) // 1 GB per sequence = 64
    assert max_concurrency(80 * 10**9, 16 * 10**9, 10**9) == 64
    assert max_concurrency(10, 20, 1) == 0
    s = spec("llama-3-8b")  # 131,072 bytes per token at fp16 (2 x 32 x 8 x 128 x 2)
    # 1 GiB of room for 2 sequences: 2**30 / 2 / 131,072 = 4,096 tokens each
    assert max_context(s, 2**30 + 500, 500, 2, "fp16", limit=100_000) == 4096
    assert max_context(s, 2**30 + 500, 500, 2, "fp16", limit=1000) == 1000


def test_decode_bound_is_bandwidth_over_bytes_read() -> None:
    # 3,350 GB/s over 16.06 GB of bf16 Llama-3-8B weights: 208.6 tokens/s
    assert decode_tokens_per_s([(16_059_990_016, 3350)]) == pytest.approx(208.59, abs=0.01)
    # split: 10 GB at 1,000 GB/s (10 ms) + 2 GB at 50 GB/s (40 ms) -> 20 tokens/s
    assert decode_tokens_per_s([(10e9, 1000), (2e9, 50)]) == pytest.approx(20.0)
    with pytest.raises(ValueError):
        decode_tokens_per_s([])


def test_8b_prefill_of_10k_tokens_on_h100_is_200_to_400_ms() -> None:
    s = spec("llama-3-8b")
    # 2 x 8.03e9 params x 10,000 tokens = 1.606e14 FLOPs / (989e12 x 0.5) = 0.325 s
    t = prefill_seconds(s.params_active or 0, 10_000, 989)
    assert t == pytest.approx(2 * 8_029_995_008 * 10_000 / (989e12 * 0.5))
    assert 0.2 <= t <= 0.4


def test_fit_is_not_fast_70b_on_m3_ultra_vs_h100s() -> None:
    s = spec("llama-3-70b")  # 141.1 GB of bf16 weights
    mac = plan(host("mac-studio-m3-ultra"), s, installed=ALL)
    hgx = plan(host("hgx-8x-h100"), s, installed=ALL)
    assert mac.capacity and hgx.capacity
    assert mac.capacity.fit == "fast" and mac.capacity.memory == "unified"  # 141 + 2.7 GB <= 0.75 x 192 GiB
    assert hgx.capacity.fit == "fast" and hgx.capacity.devices_used == 2
    mac_tps, hgx_tps = mac.capacity.decode_tokens_per_s, hgx.capacity.decode_tokens_per_s
    assert mac_tps and hgx_tps
    # 819 GB/s / ~142 GB = ~5.8 tokens/s; 2 x 3,350 GB/s (tensor parallel) / ~142 GB = ~47
    assert mac_tps == pytest.approx(819e9 / (s.weight_bytes + kv_bytes(s, 768, "fp16")), rel=1e-6)
    assert hgx_tps / mac_tps > 5
