"""Host snapshots in `enginegate detect --json`'s schema, and model files in each layout.

Each host is the JSON `detect --json` would print on that machine (names and memory sizes as
NVML / rocm-smi / system_profiler report them, datasheet figures looked up from the table the
way the probes do), validated by `HardwareSnapshot.model_validate`. Probes that fail leave
their part null with an issue, as `detect()` does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from gateway.hardware import HardwareSnapshot
from gateway.hardware.figures import figures_for

MIB = 2**20
GIB = 2**30
NO_NVML = {"probe": "nvidia", "reason": "NVML: NVML Shared Library Not Found"}


def _figures(name: str, cores: int | None = None) -> dict[str, Any]:
    return figures_for(name, gpu_cores=cores).model_dump()


def cpu(model: str, cores: int, threads: int | None = None, arch: str = "x86_64", bw: float | None = None) -> dict[str, Any]:
    return {
        "model": model,
        "architecture": arch,
        "logical_cores": threads or cores,
        "physical_cores": cores,
        "instruction_sets": ["avx2", "avx512f"] if arch == "x86_64" else ["neon"],
        "measured_bandwidth_gbps": bw,
    }


def nvidia_gpu(
    index: int,
    name: str,
    mem_mib: int | None,
    cc: tuple[int, int],
    peers: tuple[int, ...] = (),
    nvswitch: bool = False,
) -> dict[str, Any]:
    return {
        "index": index,
        "name": name,
        "uuid": f"GPU-{index:08d}",
        "pci_bus_id": f"00000000:{0x18 + index:02X}:00.0",
        "memory_total_bytes": None if mem_mib is None else mem_mib * MIB,
        "memory_free_bytes": None if mem_mib is None else (mem_mib - 500) * MIB,
        "compute_capability": list(cc),
        "pcie_generation": 5,
        "pcie_width": 16,
        "nvlink_active_links": 18 if peers else 0,
        "nvlink_peers": list(peers),
        "nvswitch": nvswitch,
        "mig_enabled": False,
        "figures": _figures(name),
    }


def nvidia_host(
    name: str,
    mem_mib: int | None,
    count: int,
    cc: tuple[int, int],
    link: str = "pcie",
    ram_gib: int | None = 512,
    cpu_info: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`link`: "nvswitch" (all joined), "pairs" (NVLink bridges between 0-1, 2-3...) or "pcie"."""
    gpus = []
    for i in range(count):
        if link == "nvswitch":
            peers = tuple(j for j in range(count) if j != i)
        elif link == "pairs":
            peers = (i ^ 1,) if (i ^ 1) < count else ()
        else:
            peers = ()
        gpus.append(nvidia_gpu(i, name, mem_mib, cc, peers, nvswitch=link == "nvswitch"))
    return snapshot(
        cpu_info or cpu("AMD EPYC 9654 96-Core Processor", 192, 384),
        ram_gib,
        nvidia={"driver_version": "570.124.06", "cuda_version": "12.8", "gpus": gpus},
    )


def snapshot(
    cpu_info: dict[str, Any],
    ram_gib: float | None,
    nvidia: dict[str, Any] | None = None,
    apple: dict[str, Any] | None = None,
    amd: dict[str, Any] | None = None,
    issues: list[dict[str, str]] | None = None,
    os_name: str = "Linux",
) -> dict[str, Any]:
    ram = None if ram_gib is None else int(ram_gib * GIB)
    default_issues = [] if nvidia is not None else [NO_NVML]
    return {
        "os": os_name,
        "cpu": cpu_info,
        "memory": {"total_bytes": ram, "available_bytes": None if ram is None else int(ram * 0.9)},
        "nvidia": nvidia,
        "apple": apple,
        "amd": amd,
        "issues": default_issues if issues is None else issues,
    }


def apple_host(chip: str, mem_gib: int, gpu_cores: int, cpu_cores: int) -> dict[str, Any]:
    apple = {"chip": chip, "unified_memory_bytes": mem_gib * GIB, "gpu_cores": gpu_cores, "figures": _figures(chip, gpu_cores)}
    return snapshot(cpu(chip, cpu_cores, arch="arm64"), mem_gib, apple=apple, os_name="Darwin")


def amd_host(name: str, mem_gib: int, count: int, xgmi: bool = True) -> dict[str, Any]:
    gpus = [
        {"index": i, "name": name, "memory_total_bytes": mem_gib * GIB, "link_type": "XGMI" if xgmi else "PCIE",
         "figures": _figures(name)}
        for i in range(count)
    ]
    return snapshot(cpu("AMD EPYC 9575F 64-Core Processor", 128, 256), 1536, amd={"source": "amdsmi", "gpus": gpus})


HOSTS: dict[str, dict[str, Any]] = {
    "8x-h200-nvswitch": nvidia_host("NVIDIA H200", 143771, 8, (9, 0), "nvswitch", 2048),
    "8x-b200-nvswitch": nvidia_host("NVIDIA B200", 183359, 8, (10, 0), "nvswitch", 2048),
    "4x-gb200-nvl": nvidia_host("NVIDIA GB200", 189471, 4, (10, 0), "nvswitch", 884),
    "8x-h100-nvswitch": nvidia_host("NVIDIA H100 80GB HBM3", 81559, 8, (9, 0), "nvswitch", 2048),
    "8x-l40s-pcie": nvidia_host("NVIDIA L40S", 46068, 8, (8, 9), "pcie", 1024),
    "4x-h100-nvl-pairs": nvidia_host("NVIDIA H100 NVL", 95830, 4, (9, 0), "pairs", 1024),
    "1x-h100": nvidia_host("NVIDIA H100 80GB HBM3", 81559, 1, (9, 0), "pcie", 256),
    "1x-rtx-5090": nvidia_host("NVIDIA GeForce RTX 5090", 32607, 1, (12, 0), "pcie", 64,
                                cpu("AMD Ryzen 9 9950X 16-Core Processor", 16, 32)),
    "2x-rtx-5090": nvidia_host("NVIDIA GeForce RTX 5090", 32607, 2, (12, 0), "pcie", 128,
                                cpu("AMD Ryzen 9 9950X 16-Core Processor", 16, 32)),
    "1x-rtx-5080": nvidia_host("NVIDIA GeForce RTX 5080", 16303, 1, (12, 0), "pcie", 64,
                                cpu("Intel(R) Core(TM) Ultra 9 285K", 24, 24)),
    "1x-rtx-pro-6000": nvidia_host("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 97887, 1, (12, 0), "pcie", 256),
    "1x-rtx-3090-ti": nvidia_host("NVIDIA GeForce RTX 3090 Ti", 24564, 1, (8, 6), "pcie", 64,
                                   cpu("AMD Ryzen 9 5950X 16-Core Processor", 16, 32)),
    "8x-mi325x-xgmi": amd_host("AMD Instinct MI325X", 256, 8),
    "8x-mi355x-xgmi": amd_host("AMD Instinct MI355X", 288, 8),
    "m4-max-128": apple_host("Apple M4 Max", 128, 40, 16),
    "m4-max-36-binned": apple_host("Apple M4 Max", 36, 32, 14),
    "m3-ultra-512": apple_host("Apple M3 Ultra", 512, 80, 32),
    "m4-pro-48": apple_host("Apple M4 Pro", 48, 20, 14),
    "m3-max-36-binned": apple_host("Apple M3 Max", 36, 30, 14),
    "cpu-2x-epyc-768g": snapshot(cpu("AMD EPYC 9654 96-Core Processor", 192, 384, bw=20.0), 768),
    "cpu-xeon-unmeasured": snapshot(cpu("Intel(R) Xeon(R) Gold 6430", 64, 128), 512),
}


def mixed_pcie() -> dict[str, Any]:
    """One 96 GB RTX PRO 6000 and two 24 GB RTX 4090s on PCIe: a workstation grown over time."""
    gpus = [
        nvidia_gpu(0, "NVIDIA GeForce RTX 4090", 24564, (8, 9)),
        nvidia_gpu(1, "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 97887, (12, 0)),
        nvidia_gpu(2, "NVIDIA GeForce RTX 4090", 24564, (8, 9)),
    ]
    return snapshot(cpu("AMD Ryzen Threadripper PRO 7975WX 32-Cores", 32, 64), 512,
                    nvidia={"driver_version": "570.124.06", "cuda_version": "12.8", "gpus": gpus})


def failed_nvml() -> dict[str, Any]:
    """A GPU server whose NVML probe fails after a driver upgrade without a reboot."""
    return snapshot(cpu("AMD EPYC 9654 96-Core Processor", 192, 384), 2048,
                    issues=[{"probe": "nvidia", "reason": "NVML: Driver/library version mismatch"}])


def null_vram(name: str = "NVIDIA H100 80GB HBM3") -> dict[str, Any]:
    """NVML answers but refuses the memory query (recorded as null)."""
    host = nvidia_host(name, None, 2, (9, 0), "nvswitch", 512)
    return host


def null_ram() -> dict[str, Any]:
    """The memory probe timed out: RAM unknown, not 0."""
    host = snapshot(cpu("Intel(R) Xeon(R) Gold 6430", 64, 128), None,
                    issues=[NO_NVML, {"probe": "memory", "reason": "timed out after 30 s"}])
    return host


def jetson_orin() -> dict[str, Any]:
    """Jetson AGX Orin 64 GB under JetPack 6: NVML names the integrated GPU "Orin (nvgpu)", memory not supported."""
    gpu = nvidia_gpu(0, "Orin (nvgpu)", None, (8, 7))
    return snapshot(cpu("ARMv8 Processor rev 1 (v8l)", 12, arch="aarch64"), 61.4,
                    nvidia={"driver_version": "540.4.0", "cuda_version": "12.6", "gpus": [gpu]})


def host_snapshot(name: str) -> HardwareSnapshot:
    builders = {"mixed-pcie": mixed_pcie, "failed-nvml": failed_nvml, "null-vram": null_vram, "null-ram": null_ram,
                "jetson-orin": jetson_orin}
    data = builders[name]() if name in builders else HOSTS[name]
    return HardwareSnapshot.model_validate_json(json.dumps(data))


# ---------------------------------------------------------------- model files


LLAMA_70B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
    "max_position_embeddings": 131072, "num_attention_heads": 64, "num_hidden_layers": 80, "num_key_value_heads": 8,
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 128256,
}
LLAMA_8B = {**LLAMA_70B, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
            "num_hidden_layers": 32}
GPT_OSS_120B = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880,
    "max_position_embeddings": 131072, "num_attention_heads": 64, "num_hidden_layers": 36, "num_key_value_heads": 8,
    "head_dim": 64, "num_local_experts": 128, "num_experts_per_tok": 4, "vocab_size": 201088,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 18,
    "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]},
}
QUANT_CONFIGS: dict[str, dict[str, Any]] = {
    "compressed-tensors-fp8": {
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"],
                                      "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True},
                                      "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}}},
        "ignore": ["lm_head"],
    },
    "compressed-tensors-w4a16": {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"],
                                      "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True}}},
        "ignore": ["lm_head"],
    },
    "compressed-tensors-nvfp4": {
        "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"],
                                      "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}}},
    },
    "fbgemm-fp8": {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0, "modules_to_not_convert": ["lm_head"]},
    "fp8-block": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
    "modelopt-fp8": {"quant_method": "modelopt", "quant_algo": "FP8"},
    "gptq-g128-desc-act": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True, "sym": True},
    "gptq-per-channel-8bit": {"quant_method": "gptq", "bits": 8, "group_size": -1, "desc_act": False},
    "awq-gemm": {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True},
    "awq-legacy-keys": {"quant_method": "awq", "w_bit": 4, "q_group_size": 64, "version": "gemv"},
    "bnb-nf4-double": {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                       "bnb_4bit_use_double_quant": True},
    "bnb-int8": {"quant_method": "bitsandbytes", "load_in_8bit": True},
}


def hf_dir(root: Path, name: str, config: dict[str, Any], side_files: dict[str, Any] | None = None) -> Path:
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    for fname, content in (side_files or {}).items():
        (d / fname).write_text(json.dumps(content))
    return d


def synthetic_gguf(
    path: Path,
    layers: int,
    hidden: int,
    ffn: int,
    heads: int,
    kv_heads: int,
    vocab: int,
    context: int = 131072,
    qtype: GGMLQuantizationType = GGMLQuantizationType.Q4_K,
    shards: int = 1,
) -> list[Path]:
    """A llama GGUF header with a real tensor table; files are sparse (truncated to full size, no data written).

    `shards` > 1 writes llama.cpp's split layout (-0000N-of-0000M.gguf), tensors spread over the shards.
    """
    tensors: list[tuple[str, tuple[int, int]]] = [("token_embd.weight", (vocab, hidden))]
    for i in range(layers):
        tensors += [
            (f"blk.{i}.attn_q.weight", (hidden, hidden)),
            (f"blk.{i}.attn_k.weight", (kv_heads * hidden // heads, hidden)),
            (f"blk.{i}.attn_v.weight", (kv_heads * hidden // heads, hidden)),
            (f"blk.{i}.attn_output.weight", (hidden, hidden)),
            (f"blk.{i}.ffn_gate.weight", (ffn, hidden)),
            (f"blk.{i}.ffn_up.weight", (ffn, hidden)),
            (f"blk.{i}.ffn_down.weight", (hidden, ffn)),
        ]
    tensors.append(("output.weight", (vocab, hidden)))
    per_shard = -(-len(tensors) // shards)
    w = gguf.GGUFWriter(path, "llama", split_max_tensors=per_shard if shards > 1 else 0)
    w.add_name(path.stem)
    w.add_block_count(layers)
    w.add_context_length(context)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    block, size = GGML_QUANT_SIZES[qtype]
    data: list[int] = []
    for name, (rows, cols) in tensors:
        nbytes = rows * cols // block * size
        w.add_tensor_info(name, (rows, cols // block * size), np.dtype(np.uint8), nbytes, raw_dtype=qtype)
        data.append(nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    if shards == 1:
        files = [path]
    else:
        files = [path.with_name(f"{path.stem}-{i:05d}-of-{shards:05d}.gguf") for i in range(1, shards + 1)]
    for i, f in enumerate(files):
        with open(f, "r+b") as fh:  # sparse: the size a real file has, no bytes written
            fh.truncate(f.stat().st_size + sum(data[i * per_shard : (i + 1) * per_shard]))
    return files
