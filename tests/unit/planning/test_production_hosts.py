"""The planner on production hosts, one table per class of error issue 13 found.

Hosts are `detect --json` snapshots (tests/unit/planning/snapshots.py), models are config.json
directories in each quantisation layout and synthetic GGUF headers (sparse files, shards too).
Expected figures are computed here from the model's own numbers, not read back from the plan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gateway.planning import ENGINES, ModelSpec, NoEngineError, Plan, Workload, installed_set, kv_bytes, load_spec, plan
from gateway.planning.capacity import paged_kv_bytes
from gateway.planning.pools import GPU_MEMORY_FRACTION
from tests.unit.hosts import MODELS, host
from tests.unit.planning.snapshots import (
    GPT_OSS_120B,
    LLAMA_8B,
    LLAMA_70B,
    QUANT_CONFIGS,
    hf_dir,
    host_snapshot,
    synthetic_gguf,
)

ALL = installed_set(set(ENGINES))
PAGED = {"vllm", "sglang", "tensorrt_llm", "dynamo", "exllamav2", "exllamav3"}
MIB = 2**20


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelSpec]:
    root = tmp_path_factory.mktemp("models")
    out = {
        "llama-8b": load_spec(hf_dir(root, "llama-8b", LLAMA_8B)),
        "llama-70b": load_spec(hf_dir(root, "llama-70b", LLAMA_70B)),
        "llama-70b-fp8": load_spec(
            hf_dir(root, "llama-70b-fp8", {**LLAMA_70B, "quantization_config": QUANT_CONFIGS["compressed-tensors-fp8"]})
        ),
        "gpt-oss-120b": load_spec(hf_dir(root, "gpt-oss-120b", GPT_OSS_120B)),
    }
    shards = synthetic_gguf(root / "llama-70b-Q4_K_M.gguf", 80, 8192, 28672, 64, 8, 128256, shards=3)
    out["llama-70b-q4-gguf"] = load_spec(shards[0])
    out["llama-8b-q4-gguf"] = load_spec(synthetic_gguf(root / "llama-8b-Q4_K_M.gguf", 32, 4096, 14336, 32, 8, 128256)[0])
    return out


def run(host_name: str, spec: ModelSpec, w: Workload, **kw: object) -> Plan:
    snap = host(host_name) if (Path(__file__).parents[2] / "fixtures" / "hosts" / host_name).is_dir() else host_snapshot(host_name)
    return plan(snap, spec, w, installed=ALL, **kw)  # type: ignore[arg-type]


# ---------------------------------------------------------------- 1. paged KV sizing


@dataclass
class Paged:
    id: str
    host: str
    model: str
    workload: Workload
    gpus: int  # GPUs per replica


PAGED_CASES = [
    Paged("70B FP8 (compressed-tensors), 128 streams of 2.5k, 8x H100", "8x-h100-nvswitch", "llama-70b-fp8",
          Workload(mode="production", concurrency=128, prompt_tokens=2000, output_tokens=500), 4),
    Paged("70B bf16, 64 streams, 8x H200", "8x-h200-nvswitch", "llama-70b", Workload(mode="production", concurrency=64), 4),
    Paged("8B bf16, 256 streams, one H100", "1x-h100", "llama-8b", Workload(mode="production", concurrency=256), 1),
    Paged("gpt-oss-120b MXFP4, 64 streams, 8x B200", "8x-b200-nvswitch", "gpt-oss-120b",
          Workload(mode="production", concurrency=64), 1),
    Paged("70B bf16, 32 streams, 8x MI325X", "8x-mi325x-xgmi", "llama-70b", Workload(mode="production", concurrency=32), 2),
]


@pytest.mark.parametrize("case", PAGED_CASES, ids=[c.id for c in PAGED_CASES])
def test_paged_engines_size_kv_for_typical_sequences_with_room_for_one_at_full_context(
    case: Paged, models: dict[str, ModelSpec]
) -> None:
    spec = models[case.model]
    w = case.workload
    p = run(case.host, spec, w)
    cap = p.capacity
    assert p.engine in PAGED and cap is not None and cap.kv_sizing == "paged"
    context = spec.context_length or 0
    assert p.options["context_length"] == context  # the trained context, not lowered
    typical = w.prompt_tokens + w.output_tokens
    weights = spec.weight_bytes or 0
    kv = max(w.concurrency * kv_bytes(spec, typical), kv_bytes(spec, context))
    assert cap.required_bytes == weights + kv
    assert cap.devices_used == case.gpus
    room = cap.usable_bytes - weights
    # vLLM's "maximum concurrency for N tokens per request", at the typical length and at full context
    assert cap.concurrency_at_typical == room // kv_bytes(spec, typical) >= w.concurrency
    assert cap.concurrency_at_full == room // kv_bytes(spec, context) >= 1
    assert not any("context lowered" in x for x in p.warnings)


def test_reserved_sizing_would_have_rejected_every_gpu_engine(models: dict[str, ModelSpec]) -> None:
    # the seed's arithmetic: 128 x 131,072 tokens x 327,680 B = 5.5 TB of KV > 8 H100s
    spec = models["llama-70b-fp8"]
    assert 128 * kv_bytes(spec, 131072) > 8 * 81559 * MIB * GPU_MEMORY_FRACTION


def test_context_is_lowered_only_with_a_warning_naming_why(models: dict[str, ModelSpec]) -> None:
    spec = models["llama-8b"].model_copy(update={"context_length": 1_000_000})
    p = run("1x-h100", spec, Workload(mode="production", concurrency=16))
    assert p.capacity and p.options["context_length"] < 1_000_000
    [lowered] = [x for x in p.warnings if "context lowered" in x]
    assert "from the trained 1000000" in lowered and "GB of KV" in lowered and "1 GPU(s)" in lowered
    # the user's explicit context wins: not lowered, and with nowhere to hold it, no engine (with figures)
    with pytest.raises(NoEngineError) as err:
        run("1x-h100", spec, Workload(context_length=1_000_000))
    assert "needs" in err.value.figures and "usable" in err.value.figures


def test_sliding_window_layers_are_paged_at_the_window(models: dict[str, ModelSpec]) -> None:
    spec = models["gpt-oss-120b"]
    assert (spec.sliding_layers, spec.sliding_window) == (18, 128)
    full = paged_kv_bytes(spec, 131072, 64, 768, "fp16")
    per_layer = 2 * 8 * 64 * 2
    assert full == max(64 * (18 * per_layer * 768 + 18 * per_layer * 128), 18 * per_layer * 131072 + 18 * per_layer * 128)


# ---------------------------------------------------------------- 2. no fall to the wrong machine


@dataclass
class Fallback:
    id: str
    host: str
    model: str
    workload: Workload = field(default_factory=Workload)
    engine: str | None = None  # None: NoEngineError
    check: Callable[[Plan], bool] | None = None


FALLBACK_CASES = [
    Fallback("70B bf16 on one H100: no engine, with the figures", "1x-h100", "llama-70b"),
    Fallback("70B bf16 on one RTX 5090: no engine, never MLX or CPU", "1x-rtx-5090", "llama-70b"),
    Fallback("70B GGUF on one RTX 5080: llama.cpp offload", "1x-rtx-5080", "llama-70b-q4-gguf", engine="llamacpp",
             check=lambda p: 0 < p.options["gpu_layers"] < 80 and p.capacity is not None and p.capacity.memory == "split"),
    Fallback("70B GGUF on 2x RTX 5090: all layers split over both GPUs", "2x-rtx-5090", "llama-70b-q4-gguf",
             Workload(context_length=8192), engine="llamacpp",
             check=lambda p: p.options["gpu_layers"] == -1 and p.options.get("split_mode") == "layer"),
    Fallback("70B bf16 on 8x L40S: pipeline over PCIe, never CPU", "8x-l40s-pcie", "llama-70b", Workload(mode="production"),
             engine="vllm", check=lambda p: p.options["pipeline_parallel"] > 1 and p.options["tensor_parallel"] == 1),
    Fallback("bf16 on a CPU-only server: vLLM's CPU build, not MLX", "cpu-xeon-unmeasured", "llama-8b", engine="vllm"),
    Fallback("bf16 on an M4 Max: MLX", "m4-max-128", "llama-8b", engine="mlx"),
]


@pytest.mark.parametrize("case", FALLBACK_CASES, ids=[c.id for c in FALLBACK_CASES])
def test_a_model_that_cannot_fit_the_gpus_never_lands_on_mlx_or_the_cpu_silently(
    case: Fallback, models: dict[str, ModelSpec]
) -> None:
    spec = models[case.model]
    if case.engine is None:
        with pytest.raises(NoEngineError) as err:
            run(case.host, spec, case.workload)
        message = str(err.value)
        assert "mlx: needs apple" in message and "GB" in err.value.figures and "usable" in err.value.figures
        assert f"weights {(spec.weight_bytes or 0) / 1e9:.1f} GB" in err.value.figures
        snap = host_snapshot(case.host)
        assert snap.nvidia
        gpu = snap.nvidia.gpus[0]
        need = (spec.weight_bytes or 0) + kv_bytes(spec, spec.context_length or 0)
        k = -(-need // int((gpu.memory_total_bytes or 0) * GPU_MEMORY_FRACTION))
        assert f"it would take {k} x {gpu.name}" in err.value.figures
        return
    p = run(case.host, spec, case.workload)
    assert p.engine == case.engine, (p.reasons, p.warnings)
    assert case.check is None or case.check(p), (p.options, p.capacity)


def test_mlx_runs_on_nvidia_only_when_requested_and_says_so(models: dict[str, ModelSpec]) -> None:
    p = run("1x-h100", models["llama-8b"], Workload(), requested_engine="mlx")
    assert p.engine == "mlx" and any("mlx was requested but needs apple" in x for x in p.warnings)


# ---------------------------------------------------------------- 3. GPU count by objective


@dataclass
class Gpus:
    id: str
    host: str
    model: str
    workload: Workload
    tp: int
    pp: int
    dp: int
    free: tuple[int, ...]
    used: tuple[int, ...] | None = None


GPU_CASES = [
    Gpus("70B FP8 production latency, 8x H100: TP2, 6 free (weights under half the memory)", "8x-h100-nvswitch",
         "llama-70b-fp8", Workload(mode="production"), 2, 1, 1, (2, 3, 4, 5, 6, 7)),
    Gpus("70B FP8 local, 8K context, 8x H100: the one GPU that holds it", "8x-h100-nvswitch", "llama-70b-fp8",
         Workload(context_length=8192), 1, 1, 1, (1, 2, 3, 4, 5, 6, 7)),
    Gpus("70B FP8 local, full 128K context, 8x H100: two GPUs hold one sequence at 128K", "8x-h100-nvswitch",
         "llama-70b-fp8", Workload(), 2, 1, 1, (2, 3, 4, 5, 6, 7)),
    Gpus("70B FP8 cost, 8K context, 8x H100: the fewest", "8x-h100-nvswitch", "llama-70b-fp8",
         Workload(mode="production", objective="cost", context_length=8192), 1, 1, 1, (1, 2, 3, 4, 5, 6, 7)),
    Gpus("70B FP8 throughput, 8x H100: 4 replicas of TP2", "8x-h100-nvswitch", "llama-70b-fp8",
         Workload(mode="production", objective="throughput", concurrency=256), 2, 1, 4, ()),
    Gpus("8B throughput, 8x H200: 8 replicas", "8x-h200-nvswitch", "llama-8b",
         Workload(mode="production", objective="throughput", concurrency=512), 1, 1, 8, ()),
    Gpus("70B bf16 production, 4x H100 NVL in NVLink pairs: TP2 x PP2", "4x-h100-nvl-pairs", "llama-70b",
         Workload(mode="production", concurrency=32), 2, 2, 1, ()),
    Gpus("70B bf16 production, 8x L40S PCIe: pipeline", "8x-l40s-pcie", "llama-70b", Workload(mode="production"),
         1, 8, 1, ()),
    Gpus("70B bf16 production, 8x MI355X XGMI: TP2", "8x-mi355x-xgmi", "llama-70b", Workload(mode="production"),
         2, 1, 1, (2, 3, 4, 5, 6, 7)),
    Gpus("70B FP8 throughput, 4x H100 NVL in NVLink pairs: a TP2 replica per pair", "4x-h100-nvl-pairs",
         "llama-70b-fp8", Workload(mode="production", objective="throughput", concurrency=64), 2, 1, 2, ()),
    Gpus("8B throughput, 8x L40S PCIe: 8 replicas", "8x-l40s-pcie", "llama-8b",
         Workload(mode="production", objective="throughput", concurrency=256), 1, 1, 8, ()),
    Gpus("70B bf16 throughput, 8x MI325X: 4 TP2 replicas", "8x-mi325x-xgmi", "llama-70b",
         Workload(mode="production", objective="throughput", concurrency=256), 2, 1, 4, ()),
    Gpus("8B on a mixed box: the 96 GB card, not 3 x the smallest", "mixed-pcie", "llama-8b", Workload(),
         1, 1, 1, (0, 2), used=(1,)),
]


@pytest.mark.parametrize("case", GPU_CASES, ids=[c.id for c in GPU_CASES])
def test_gpus_follow_the_objective_and_the_free_ones_are_named(case: Gpus, models: dict[str, ModelSpec]) -> None:
    p = run(case.host, models[case.model], case.workload)
    cap = p.capacity
    assert cap is not None and p.engine in PAGED
    assert (p.options["tensor_parallel"], p.options["pipeline_parallel"], p.options.get("data_parallel", 1)) == (
        case.tp, case.pp, case.dp)
    assert cap.free_gpus == case.free
    assert len(cap.gpus) == case.tp * case.pp * case.dp and not set(cap.gpus) & set(cap.free_gpus)
    if case.used is not None:
        assert cap.gpus == case.used
    # engines take GPUs 0..n-1 unless told: the plan names the set when some stay free
    visible = p.options.get("env", {})
    if case.free:
        var = "HIP_VISIBLE_DEVICES" if "mi3" in case.host else "CUDA_VISIBLE_DEVICES"
        assert visible == {var: ",".join(map(str, cap.gpus))}
    else:
        assert visible == {}
    if case.workload.mode == "production" and case.workload.objective != "cost":
        assert (cap.weights_bytes <= 0.5 * cap.usable_bytes) or cap.free_gpus == ()


def test_mixed_gpu_sizes_split_by_memory_for_llama_cpp(models: dict[str, ModelSpec]) -> None:
    # 96 GB + 2 x 24 GB: even shards (vLLM) would hold 2 x 24 GB on two cards; llama.cpp's layer split
    # holds the sum, so the 96 GB card and one 4090 take 110 GB of weights + 2.7 GB of KV, and one 4090 stays free
    spec = models["llama-70b-q4-gguf"].model_copy(update={"file_bytes": 110_000_000_000})
    p = run("mixed-pcie", spec, Workload(context_length=8192))
    assert p.engine == "llamacpp" and p.options["gpu_layers"] == -1 and p.options["split_mode"] == "layer"
    assert p.capacity and p.capacity.usable_bytes == int((97887 + 24564) * MIB * GPU_MEMORY_FRACTION)
    assert p.capacity.gpus == (0, 1) and p.capacity.free_gpus == (2,)
    assert p.options["tensor_split"] == [24, 96, 0]  # GiB per GPU in index order; 0 keeps GPU 2 free


# ---------------------------------------------------------------- 4. CPU production concurrency


def test_cpu_production_concurrency_goes_to_llama_server_slots(models: dict[str, ModelSpec]) -> None:
    spec = models["llama-8b-q4-gguf"]
    p = run("cpu-2x-epyc-768g", spec, Workload(mode="production", concurrency=32))
    assert p.engine == "llama_server" and p.options["parallel"] == 32
    assert p.options["extra_args"] == ["--kv-unified"]
    assert p.options["context_length"] == max(32 * 768, spec.context_length or 0)
    assert p.options["threads"] == 191  # 192 cores, one kept for the gateway
    cap = p.capacity
    assert cap and cap.decode_tokens_per_s and cap.aggregate_tokens_per_s
    # one weight read per batched step serves all 32: far above one sequence's rate, below 32x it
    assert cap.decode_tokens_per_s * 4 < cap.aggregate_tokens_per_s < cap.decode_tokens_per_s * 32
    assert any("aggregate decode at most" in r for r in p.reasons)


def test_an_explicit_in_process_llamacpp_is_kept(models: dict[str, ModelSpec]) -> None:
    p = run("cpu-2x-epyc-768g", models["llama-8b-q4-gguf"], Workload(concurrency=8), requested_engine="llamacpp")
    assert p.engine == "llamacpp"


def test_this_build_machine_plan_stays_as_measured() -> None:
    from tests.unit.hosts import embedded_gguf

    p = plan(host("build-machine"), load_spec(embedded_gguf()), installed=ALL)
    assert p.engine == "llamacpp" and p.options["threads"] == 1 and p.options["gpu_layers"] == 0
    assert p.options["parallel"] == 1 and "extra_args" not in p.options and p.assumed == ()


# ---------------------------------------------------------------- 5. fit is not speed


def test_70b_in_unified_memory_fits_but_two_h100s_would_be_faster() -> None:
    p = run("mac-studio-m3-ultra", load_spec(MODELS / "llama-3-70b"), Workload())
    assert p.engine == "mlx" and p.capacity and p.capacity.decode_tokens_per_s
    rate = p.capacity.decode_tokens_per_s
    assert 5.5 < rate < 6.0  # 819 GB/s over 141 GB
    [slow] = [x for x in p.warnings if x.startswith("fits, but")]
    assert f"~{rate:.1f} tokens/s" in slow and "vllm on 2 x NVIDIA H100 80GB HBM3" in slow
    alt = 2 * 3350e9 / p.capacity.bytes_per_token
    assert f"~{alt:.0f} tokens/s" in slow and "rejected here" in slow


def test_pipeline_over_pcie_warns_with_the_tensor_parallel_alternative(models: dict[str, ModelSpec]) -> None:
    p = run("8x-l40s-pcie", models["llama-70b"], Workload(mode="production"))
    [slow] = [x for x in p.warnings if x.startswith("fits, but")]
    assert "on 4 x NVIDIA H100 80GB HBM3 (tensor parallel" in slow


def test_the_workloads_own_rate_is_the_bar(models: dict[str, ModelSpec]) -> None:
    fast_enough = run("8x-h100-nvswitch", models["llama-8b"], Workload(mode="production"))
    assert not any(x.startswith("fits, but") for x in fast_enough.warnings)
    demanding = run("8x-h100-nvswitch", models["llama-8b"], Workload(mode="production", decode_tokens_per_s=500))
    assert any("below the 500 tokens/s the workload needs" in x for x in demanding.warnings)


# ---------------------------------------------------------------- 6. unknowns


@dataclass
class Unknown:
    id: str
    host: str
    model: str
    says: str  # in plan.assumed
    engine: str | None = None


UNKNOWN_CASES = [
    Unknown("failed NVML probe", "failed-nvml", "llama-8b-q4-gguf",
            "the NVIDIA probe failed (NVML: Driver/library version mismatch)", "llamacpp"),
    Unknown("null VRAM on a known GPU: the datasheet's size", "null-vram", "llama-8b", "assumed the datasheet's 80 GB"),
    Unknown("null RAM: unknown, not 0", "null-ram", "llama-8b-q4-gguf", "system RAM size unknown", "llamacpp"),
    Unknown("Jetson Orin: integrated GPU sized against RAM", "jetson-orin", "llama-8b-q4-gguf", "shares system memory"),
    Unknown("RTX 3090 Ti has its own figures", "1x-rtx-3090-ti", "llama-8b", ""),
]


@pytest.mark.parametrize("case", UNKNOWN_CASES, ids=[c.id for c in UNKNOWN_CASES])
def test_what_could_not_be_read_is_named_with_what_was_assumed(case: Unknown, models: dict[str, ModelSpec]) -> None:
    p = run(case.host, models[case.model], Workload())
    if case.engine:
        assert p.engine == case.engine
    if case.says:
        assert any(case.says in a for a in p.assumed), p.assumed
    assert not any("does not fit" in x for x in p.warnings)


def test_null_ram_is_unknown_not_zero(models: dict[str, ModelSpec]) -> None:
    p = run("null-ram", models["llama-8b-q4-gguf"], Workload())
    assert p.capacity and not p.capacity.memory_known and p.capacity.fit == "system"


def test_a_gpu_outside_the_table_with_null_memory_is_assumed_to_fit_and_said(models: dict[str, ModelSpec]) -> None:
    from tests.unit.planning.snapshots import null_vram

    data = null_vram("NVIDIA Future Accelerator X1")
    from gateway.hardware import HardwareSnapshot

    p = plan(HardwareSnapshot.model_validate(data), models["llama-8b"], installed=ALL)
    assert p.capacity and not p.capacity.memory_known
    assert any("not in the hardware table: assumed the model fits" in a for a in p.assumed)
    assert any("'NVIDIA Future Accelerator X1' is not in gateway/data/hardware.yaml" in a for a in p.assumed)


def test_a_near_name_takes_no_figures_and_is_named() -> None:
    from gateway.hardware import HardwareSnapshot
    from tests.unit.planning.snapshots import nvidia_host

    snap = HardwareSnapshot.model_validate(nvidia_host("NVIDIA GeForce RTX 3060 Ti", 8192, 1, (8, 6)))
    assert snap.nvidia and snap.nvidia.gpus[0].figures.memory_bandwidth_gbps is None
    p = plan(snap, load_spec(MODELS / "llama-3-8b-exl2"), installed=ALL)
    assert any("variant of the table's 'rtx 3060'" in a for a in p.assumed)
    assert p.capacity and p.capacity.decode_tokens_per_s is None


def test_config_without_kv_heads_is_assumed_mha_and_said(tmp_path: Path) -> None:
    cfg = {k: v for k, v in LLAMA_8B.items() if k != "num_key_value_heads"}
    spec = load_spec(hf_dir(tmp_path, "llama-2-style", cfg))
    assert spec.kv_heads == 32 and any("no num_key_value_heads" in n for n in spec.notes)
    p = plan(host("1x-h100") if False else host_snapshot("1x-h100"), spec, installed=ALL)
    assert any("assumed full multi-head attention (32 KV heads)" in a for a in p.assumed)
    falcon = load_spec(hf_dir(tmp_path, "mqa", {**cfg, "multi_query": True}))
    assert falcon.kv_heads == 1 and not falcon.notes


def test_no_engine_error_carries_needed_and_usable(models: dict[str, ModelSpec]) -> None:
    with pytest.raises(NoEngineError) as err:
        run("1x-h100", models["llama-70b"], Workload())
    usable = 81559 * MIB * GPU_MEMORY_FRACTION / 1e9
    assert f"1 GPU(s) {usable:.1f} GB usable" in str(err.value)
    # 141.1 GB of weights + 42.9 GB for one sequence at 131,072 tokens = 184.1 GB: 3 x 77.0 GB
    assert "needs 184.1 GB" in str(err.value) and "it would take 3 x NVIDIA H100 80GB HBM3" in str(err.value)


def test_context_on_a_mixed_box_is_fitted_to_the_big_card_not_three_small_ones(models: dict[str, ModelSpec]) -> None:
    # 8B bf16 with a 1M-token trained context: the 96 GB card alone (86.1 GB usable) holds more KV
    # than 3 GPUs sharded evenly (3 x 24 GB x 0.9 = 64.8 GB)
    spec = models["llama-8b"].model_copy(update={"context_length": 1_000_000})
    p = run("mixed-pcie", spec, Workload())
    assert p.capacity and p.capacity.gpus == (1,)
    room = int(97887 * MIB * GPU_MEMORY_FRACTION) - (spec.weight_bytes or 0)
    assert p.options["context_length"] == room // 131072 // 256 * 256


# ---------------------------------------------------------------- invariants over every host x model x workload

SWEEP_HOSTS = [*sorted(__import__("tests.unit.planning.snapshots", fromlist=["HOSTS"]).HOSTS),
               "mixed-pcie", "failed-nvml", "null-vram", "null-ram", "jetson-orin"]
SWEEP_WORKLOADS = [
    Workload(),
    Workload(mode="production", concurrency=64),
    Workload(mode="production", objective="throughput", concurrency=256, prompt_tokens=4000, output_tokens=1000),
    Workload(mode="production", objective="cost", concurrency=8, context_length=32768),
]


@pytest.mark.parametrize("host_name", SWEEP_HOSTS)
def test_invariants_hold_on_every_host(host_name: str, models: dict[str, ModelSpec]) -> None:
    snap = host_snapshot(host_name)
    gpu_host = bool((snap.nvidia and snap.nvidia.gpus) or (snap.amd and snap.amd.gpus))
    for spec in models.values():
        for w in SWEEP_WORKLOADS:
            try:
                p = plan(snap, spec, w, installed=ALL)
            except NoEngineError as err:
                assert err.figures.startswith("needs ") and "usable" in err.figures
                continue
            cap = p.capacity
            assert cap is not None
            where = (host_name, spec.path, w)
            assert p.engine not in ("mlx", "mlx_server") or snap.apple is not None, where
            assert not set(cap.gpus) & set(cap.free_gpus), where
            if cap.fit == "fast" and cap.memory_known:
                assert cap.required_bytes <= cap.usable_bytes, where
            if gpu_host and cap.memory in ("system", "split"):
                # off the GPUs only through llama.cpp, and never without saying so
                assert p.engine in ("llamacpp", "llama_server"), where
                assert any("system RAM" in x for x in p.warnings), where
            if p.engine in PAGED:
                assert cap.kv_sizing == "paged" and cap.concurrency_at_full >= 1 or not cap.memory_known, where
            if w.context_length is None and p.options.get("context_length", 0) < (spec.context_length or 0):
                assert any("context lowered" in x for x in p.warnings) or p.engine == "llama_server", where


@pytest.mark.parametrize(
    "issue,says",
    [
        ({"probe": "nvidia", "reason": "NVML: Driver Not Loaded"}, "the NVIDIA probe failed (NVML: Driver Not Loaded)"),
        ({"probe": "nvidia", "reason": "timed out after 30 s"}, "the NVIDIA probe failed (timed out after 30 s)"),
        ({"probe": "amd", "reason": "amdsmi: AMDSMI_STATUS_NO_PERM"}, "the AMD probe failed (amdsmi: AMDSMI_STATUS_NO_PERM)"),
        ({"probe": "cpu", "reason": "/proc/cpuinfo not readable"}, "the CPU probe failed"),
        ({"probe": "nvidia", "reason": "NVML: NVML Shared Library Not Found"}, None),  # no NVIDIA stack: no GPU, no noise
    ],
)
def test_failed_probes_are_named(issue: dict[str, str], says: str | None, models: dict[str, ModelSpec]) -> None:
    from gateway.hardware import HardwareSnapshot
    from tests.unit.planning.snapshots import cpu, snapshot

    snap = HardwareSnapshot.model_validate(snapshot(cpu("Intel(R) Xeon(R) Gold 6430", 64, 128), 512, issues=[issue]))
    p = plan(snap, models["llama-8b-q4-gguf"], installed=ALL)
    assert p.engine == "llamacpp"
    if says is None:
        assert p.assumed == ()
    else:
        assert any(says in a for a in p.assumed), p.assumed


def test_offloaded_gguf_is_slow_and_the_all_gpu_alternative_is_a_layer_split() -> None:
    from tests.unit.planning.test_plan_scenarios import llama70_q4_k_m, one_rtx_4090

    s = one_rtx_4090()
    measured = s.model_copy(update={"cpu": s.cpu.model_copy(update={"measured_bandwidth_gbps": 60.0})})
    p = plan(measured, llama70_q4_k_m(), installed=ALL)
    assert p.capacity and p.capacity.decode_tokens_per_s and p.capacity.decode_tokens_per_s < 10
    [slow] = [x for x in p.warnings if x.startswith("fits, but")]
    # 2 x 24 GB hold it; llama.cpp runs the two halves in turn, so one card's 1,008 GB/s
    alt = 1008e9 / p.capacity.bytes_per_token
    assert "llamacpp on 2 x NVIDIA GeForce RTX 4090 (layers split over them" in slow and f"~{alt:.0f} tokens/s" in slow
    assert "this host has 1" in slow


def test_tensor_parallel_size_divides_the_attention_heads(tmp_path: Path) -> None:
    # 28 attention heads (Qwen2.5-7B's count): 8 GPUs cannot split them evenly, so TP4 x PP2 (vLLM refuses TP8)
    cfg = {**LLAMA_70B, "num_attention_heads": 40, "num_key_value_heads": 8, "hidden_size": 5120,
           "intermediate_size": 27648, "num_hidden_layers": 64}
    spec = load_spec(hf_dir(tmp_path, "forty-heads", cfg))
    p = run("8x-l40s-pcie", spec, Workload(mode="production"))
    assert p.options["tensor_parallel"] * p.options["pipeline_parallel"] == p.capacity.devices_used  # type: ignore[union-attr]
    seven = run("8x-h100-nvswitch", spec.model_copy(update={"attention_heads": 28}),
                Workload(mode="production", objective="throughput", context_length=8192))
    assert 28 % seven.options["tensor_parallel"] == 0
    big = spec.model_copy(update={"attention_heads": 28, "file_bytes": 400_000_000_000})
    p8 = run("8x-h100-nvswitch", big, Workload(context_length=8192))
    assert (p8.options["tensor_parallel"], p8.options["pipeline_parallel"]) == (4, 2)
