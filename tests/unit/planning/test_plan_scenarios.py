"""Table-driven engine selection: one row per recipe and edge, with no machine."""

from dataclasses import dataclass, field
from functools import cache
from typing import Any

import pytest

from gateway.hardware import HardwareSnapshot
from gateway.planning import ENGINES, ModelSpec, NoEngineError, Plan, Workload, installed_set, load_spec, plan
from tests.unit.hosts import MODELS, embedded_gguf, host

ALL = installed_set(set(ENGINES))


@cache
def model(name: str) -> ModelSpec:
    return load_spec(embedded_gguf()) if name == "smollm2" else load_spec(MODELS / name)


def llama70_q4_k_m() -> ModelSpec:
    """Llama-3-70B as a Q4_K_M GGUF (4.85 bits per weight): no 42 GB file in the repo, same arithmetic."""
    return model("llama-3-70b").model_copy(
        update={"format": "gguf", "bits_per_weight": 4.85, "path": "llama-3-70b.Q4_K_M.gguf"}
    )


def one_rtx_4090() -> HardwareSnapshot:
    s = host("2x-rtx-4090")
    assert s.nvidia
    return s.model_copy(update={"nvidia": s.nvidia.model_copy(update={"gpus": s.nvidia.gpus[:1]})})


@dataclass
class Case:
    id: str
    host: str
    model: str
    workload: Workload = field(default_factory=Workload)
    engine: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    rule: str = ""


CASES = [
    Case(
        "build machine, embedded GGUF",
        "build-machine",
        "smollm2",
        engine="llamacpp",
        options={"gpu_layers": 0, "threads": 1, "parallel": 1, "context_length": 8192},
        rule="cpu-only",
    ),
    Case(
        "Raspberry Pi 5 (CPU-only ARM board)",
        "raspberry-pi-5",
        "smollm2",
        engine="llamacpp",
        options={"threads": 3, "gpu_layers": 0},
        rule="cpu-only",
    ),
    Case("host without NVML", "no-nvml", "smollm2", engine="llamacpp", options={"threads": 7}, rule="cpu-only"),
    Case("M3 Ultra, MLX 4-bit 70B", "mac-studio-m3-ultra", "llama-3-70b-mlx-4bit", engine="mlx", rule="apple-silicon"),
    Case(
        "M3 Ultra, GGUF-only model -> llama.cpp with Metal",
        "mac-studio-m3-ultra",
        "smollm2",
        engine="llamacpp",
        options={"gpu_layers": -1},
        rule="apple-silicon",
    ),
    Case("MacBook Air M2, GGUF", "macbook-air-m2", "smollm2", engine="llamacpp", rule="apple-silicon"),
    Case(
        "one RTX 3060, EXL2",
        "rtx-3060",
        "llama-3-8b-exl2",
        engine="exllamav2",
        options={"tensor_parallel": 1},
        rule="one-consumer-rtx",
    ),
    Case("one RTX 3060, EXL3 (cc 8.6)", "rtx-3060", "llama-3-8b-exl3", engine="exllamav3", rule="one-consumer-rtx"),
    Case(
        "one RTX 3060, GGUF",
        "rtx-3060",
        "smollm2",
        engine="llamacpp",
        options={"gpu_layers": -1},
        rule="one-consumer-rtx",
    ),
    Case(
        "2x RTX 4090 over PCIe, EXL3 70B",
        "2x-rtx-4090",
        "llama-3-70b-exl3",
        engine="exllamav3",
        options={"tensor_parallel": 1},
        rule="several-nvidia-gpus",
    ),
    Case(
        "4x A100 with NVLink, production: tensor parallel over all 4",
        "4x-a100-nvlink",
        "llama-3-70b",
        Workload(concurrency=32, mode="production"),
        engine="vllm",
        options={"tensor_parallel": 4, "pipeline_parallel": 1, "max_concurrency": 32},
        rule="production",
    ),
    Case(
        "4x A100 with NVLink, local: the 2 GPUs that hold it (paged KV)",
        "4x-a100-nvlink",
        "llama-3-70b",
        Workload(concurrency=32),
        engine="vllm",
        options={"tensor_parallel": 2, "pipeline_parallel": 1, "max_concurrency": 32},
    ),
    Case(
        "4x A100 over PCIe, production: pipeline parallel",
        "4x-a100-pcie",
        "llama-3-70b",
        Workload(concurrency=32, mode="production"),
        engine="vllm",
        options={"tensor_parallel": 1, "pipeline_parallel": 4},
    ),
    Case(
        "MoE, 128k context, 8 short streams, 8x H100: one GPU holds it (paged KV)",
        "hgx-8x-h100",
        "qwen3-30b-a3b",
        Workload(context_length=131072, concurrency=8),
        engine="sglang",
        options={"context_length": 131072, "tensor_parallel": 1, "pipeline_parallel": 1},
        rule="long-context-moe-or-shared-prefixes",
    ),
    Case(
        "hybrid MoE (Qwen3-Next: linear attention + 512 experts), 8x H100: still the MoE rule",
        "hgx-8x-h100",
        "qwen3-next-80b-a3b",
        Workload(concurrency=8),
        engine="sglang",
        rule="long-context-moe-or-shared-prefixes",
    ),
    Case(
        "MoE, 8 streams that really hold 120k tokens each, 8x H100",
        "hgx-8x-h100",
        "qwen3-30b-a3b",
        Workload(context_length=131072, concurrency=8, prompt_tokens=120_000, output_tokens=1000),
        engine="sglang",
        options={"context_length": 131072, "tensor_parallel": 4, "pipeline_parallel": 1},
        rule="long-context-moe-or-shared-prefixes",
    ),
    Case(
        "Mixtral in production on 8x H100", "hgx-8x-h100", "mixtral-8x7b", Workload(mode="production"), engine="sglang"
    ),
    Case(
        "production serving, dense 8B",
        "hgx-8x-h100",
        "llama-3-8b",
        Workload(mode="production"),
        engine="vllm",
        options={"tensor_parallel": 1},
        rule="production",
    ),
    Case(
        "production with shared prefixes",
        "hgx-8x-h100",
        "llama-3-8b",
        Workload(mode="production", shared_prefix=True),
        engine="sglang",
    ),
    Case(
        "maximum NVIDIA throughput",
        "hgx-8x-h100",
        "llama-3-8b",
        Workload(mode="production", objective="throughput"),
        engine="tensorrt_llm",
        rule="max-nvidia-performance",
    ),
    Case(
        "fleet across nodes",
        "hgx-8x-h100",
        "llama-3-8b",
        Workload(mode="fleet", nodes=4, shared_prefix=True),
        engine="dynamo",
        options={"router_mode": "kv"},
        rule="fleet",
    ),
    Case("AMD MI300X", "2x-mi300x", "llama-3-70b", engine="vllm", rule="amd"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_scenario(case: Case) -> None:
    p = plan(host(case.host), model(case.model), case.workload, installed=ALL)
    assert p.engine == case.engine, p.reasons
    for key, value in case.options.items():
        assert p.options[key] == value, (key, p.options)
    if case.rule:
        chosen = next(c for c in p.candidates if c.engine == case.engine)
        assert chosen.rule == case.rule and f"[rule: {case.rule}]" in p.reasons[0]
    assert p.reasons and case.engine in p.summary() and "\n" not in p.summary()
    assert Plan.model_validate_json(p.model_dump_json()) == p


def test_70b_on_one_24gb_rtx_offloads_with_llamacpp() -> None:
    p = plan(one_rtx_4090(), llama70_q4_k_m(), installed=ALL)
    assert p.engine == "llamacpp"
    assert p.capacity and p.capacity.fit == "system"  # 42.8 GB of weights + KV fit in 125 GiB of RAM
    # 24,564 MiB x 0.9 = 23.18 GB usable; less 2.68 GB of KV (8,192 tokens) = 20.5 GB for layers
    # of 42.8 GB / 80 = 0.535 GB each -> 38 layers on the GPU
    assert p.options["gpu_layers"] == 38
    assert any("fits only in system RAM (38 layers offloaded to the GPU)" in w for w in p.warnings)
    assert {r.engine for r in p.rejected if r.constraint == "memory"} >= {"exllamav2", "vllm"}


def test_70b_offload_speed_is_estimated_once_ram_bandwidth_is_measured() -> None:
    s = one_rtx_4090()
    measured = s.model_copy(update={"cpu": s.cpu.model_copy(update={"measured_bandwidth_gbps": 60.0})})
    p = plan(measured, llama70_q4_k_m(), installed=ALL)
    assert p.capacity and p.capacity.decode_tokens_per_s
    spec = llama70_q4_k_m()
    w = spec.weight_bytes or 0
    # 38/80 of the weights (+ KV of 768 tokens) at 1,008 GB/s, 42/80 at 60 GB/s
    from gateway.planning import kv_bytes

    expected = 1 / ((w * 38 / 80 + kv_bytes(spec, 768)) / 1008e9 + (w * 42 / 80) / 60e9)
    assert p.capacity.decode_tokens_per_s == pytest.approx(expected)
    assert any(f"expect at most about {expected:.0f} tokens/s" in x for x in p.warnings)


def test_rtx_2080_ti_cannot_serve_exl3() -> None:
    with pytest.raises(NoEngineError, match=r"exllamav3: needs compute capability >= 8; this GPU has 7.5") as err:
        plan(host("rtx-2080-ti"), model("llama-3-8b-exl3"), installed=ALL)
    assert {r.constraint for r in err.value.rejected} >= {"compute_capability", "format"}


def test_deepseek_v3_fp8_does_not_fit_eight_h100s() -> None:
    # 671 GB of FP8 weights > 8 x 81,559 MiB x 0.9 = 615.6 GB
    with pytest.raises(NoEngineError, match="do not fit"):
        plan(host("hgx-8x-h100"), model("deepseek-v3"), Workload(context_length=131072), installed=ALL)


def test_engine_not_installed_is_reported_with_its_install_command_and_the_next_is_chosen() -> None:
    p = plan(host("hgx-8x-h100"), model("llama-3-8b"), Workload(mode="production"), installed=installed_set({"sglang"}))
    assert p.engine == "sglang" and p.installed
    vllm = next(r for r in p.rejected if r.engine == "vllm")
    assert vllm.constraint == "installed" and vllm.install and vllm.install.startswith("pip install vllm")


def test_nothing_installed_still_names_the_best_engine_and_how_to_install_it() -> None:
    p = plan(host("build-machine"), model("smollm2"), installed=installed_set(set()))
    assert p.engine == "llamacpp" and not p.installed
    assert any("not installed: pip install llama-cpp-python" in w for w in p.warnings)


def test_requested_engine_is_honoured_and_its_failed_constraints_become_warnings() -> None:
    p = plan(host("build-machine"), model("smollm2"), requested_engine="vllm", installed=ALL)
    assert p.engine == "vllm" and p.candidates[0].rule != "requested"
    assert any("vllm was requested but loads" in w for w in p.warnings)
    with pytest.raises(ValueError, match="unknown engine"):
        plan(host("build-machine"), model("smollm2"), requested_engine="nope", installed=ALL)


def test_llama_server_is_planned_as_llamacpp_and_served_by_its_own_adapter() -> None:
    in_process = plan(host("build-machine"), model("smollm2"), requested_engine="llamacpp", installed=ALL)
    served = plan(host("build-machine"), model("smollm2"), requested_engine="llama_server", installed=ALL)
    assert served.engine == "llama_server"
    assert {"threads", "parallel", "context_length"} <= set(in_process.options)
    # the in-process engine's options, plus what only llama-server reads: its KV cache type, and
    # one KV cache shared by the slots (--kv-unified)
    # one KV cache shared by the slots (--kv-unified), and its own speed-ups (off for this workload: free generation,
    # so no speculation; conversations, the default, so llama-server's host-RAM prompt cache kept and sized)
    assert served.options == {**in_process.options, "kv_cache_type": "f16", "extra_args": ["--kv-unified"],
                              "spec_type": "none", "cache_ram_mib": served.options["cache_ram_mib"]}
    assert served.options["cache_ram_mib"] > 0
    assert any("runs as llama-server" in r for r in served.reasons)


def test_context_is_capped_to_fit_when_the_workload_does_not_set_it() -> None:
    # a 12 GB card holds SmolLM2 at its full 8,192-token context: no cap; 4 streams go to llama-server,
    # whose 4 slots share one unified KV cache of max(4 x 768 typical, 8,192) tokens
    small = plan(host("rtx-3060"), model("smollm2"), Workload(concurrency=4), installed=ALL)
    assert small.engine == "llama_server" and small.options["parallel"] == 4
    assert small.options["context_length"] == 8192 and small.options["extra_args"] == ["--kv-unified"]
    big = plan(
        host("hgx-8x-h100"), model("llama-3-70b").model_copy(update={"context_length": 2_000_000}), installed=ALL
    )
    # 2M tokens x 327,680 B = 655 GB of KV + 141 GB of weights > 8 x 81,559 MiB x 0.9 = 615.6 GB;
    # (615.6 - 141.1) GB / 327,680 B = ~1.448M tokens fit, rounded down to a multiple of 256
    assert big.capacity and big.capacity.fit == "fast" and big.capacity.devices_used == 8
    assert 1_440_000 < big.options["context_length"] < 1_450_000 and big.options["context_length"] % 256 == 0
    assert any("context lowered from the trained 2000000 to" in x for x in big.warnings)


def test_every_plan_lists_candidates_and_rejections_with_their_rule_and_constraint() -> None:
    p = plan(host("rtx-3060"), model("smollm2"), installed=ALL)
    ranked = [c.engine for c in p.candidates]
    assert ranked[:3] == ["exllamav2", "exllamav3", "llamacpp"]
    rejected = {(r.engine, r.constraint) for r in p.rejected}
    assert ("exllamav2", "format") in rejected and ("exllamav3", "format") in rejected
    assert ("mlx", "format") in rejected


def test_a_model_larger_than_ram_but_not_than_ram_plus_vram_is_split() -> None:
    # RTX 3060: 12,288 MiB x 0.9 = 11.60 GB usable; RAM available 23.6 GB (fixture); a 3.2-bit
    # 70B is 28.2 GB + 2.7 GB of KV = 30.9 GB: too big for either alone, not for both together
    spec = llama70_q4_k_m().model_copy(update={"bits_per_weight": 3.2})
    p = plan(host("rtx-3060"), spec, installed=ALL)
    assert p.engine == "llamacpp"
    assert p.capacity and p.capacity.fit == "system" and p.capacity.memory == "split"
    assert 0 < p.options["gpu_layers"] < 80


@pytest.mark.parametrize(("engine", "policy"), [("vllm", "priority"), ("llamacpp", None)])
def test_priority_classes_set_the_engines_priority_scheduling_where_it_has_one(engine: str, policy: str | None) -> None:
    classes = Workload(priority_classes=True)
    p = plan(host("build-machine"), model("smollm2"), classes, requested_engine=engine, installed=ALL)
    assert p.options.get("scheduling_policy") == policy
    reason = next(r for r in p.reasons if "priority" in r)
    assert ("schedules by each request's priority" in reason) == (policy is not None)
    plain = plan(host("build-machine"), model("smollm2"), Workload(), requested_engine=engine, installed=ALL)
    assert "scheduling_policy" not in plain.options and not any("priority" in r for r in plain.reasons)
