"""Table tests: which of the engine's own speed-ups the plan turns on, for which workload and host,
in which engine flags, and with which reason."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from adapters.launch import launch_options
from adapters.llama_server import launch_args
from adapters.process import Endpoint
from adapters.sglang import engine_args as sglang_args
from adapters.tensorrt_llm import extra_options
from adapters.vllm import engine_args as vllm_args
from gateway.hardware import HardwareSnapshot
from gateway.planning import Plan, Workload, apply_user, plan
from tests.unit.hosts import host
from tests.unit.planning.test_plan_scenarios import ALL, model

EDIT = {"prompt_tokens": 400, "output_tokens": 400, "output_copies_prompt": True}
GGUF_8B = {"format": "gguf", "bits_per_weight": 4.85, "path": "llama-3-8b.Q4_K_M.gguf"}


def snapshot(name: str) -> HardwareSnapshot:
    return host(name)


def decision(p: Plan, feature: str) -> tuple[str, str]:
    d = next(f for f in p.features if f.feature == feature)
    return d.choice, d.reason


@dataclass
class Row:
    id: str
    host: str
    model: str
    workload: dict[str, Any]
    engine: str
    feature: str
    choice: str
    reason: str
    """A fragment of the reason text."""
    options: dict[str, Any] = field(default_factory=dict)
    """Options the plan must carry (None: must not carry the key)."""
    spec_update: dict[str, Any] = field(default_factory=dict)


ROWS = [
    # speculation
    Row("cpu, free generation, one stream: in-process, no speculation", "build-machine", "smollm2", {},
        "llamacpp", "speculation", "off", "has no speculative decoding", {"spec_type": None}),
    Row("cpu, edit workload, one stream: llama-server with n-gram speculation", "build-machine", "smollm2", EDIT,
        "llama_server", "speculation", "ngram", "outputs copy the prompt", {"spec_type": "ngram-simple"}),
    Row("cpu, edit workload, 2 streams: still on (measured 1.15x)", "build-machine", "smollm2",
        {**EDIT, "concurrency": 2}, "llama_server", "speculation", "ngram", "at 2 stream(s)", {"spec_type": "ngram-simple"}),
    Row("cpu, edit workload, 4 streams: off (measured slower)", "build-machine", "smollm2", {**EDIT, "concurrency": 4},
        "llama_server", "speculation", "off", "4 concurrent sequences > 2 on a CPU (measured: 0.94x at 4 streams)",
        {"spec_type": "none"}),
    Row("H100, edit workload, 4 streams: on (a GPU's small batch is bandwidth-bound)", "hgx-8x-h100", "llama-3-70b",
        {**EDIT, "concurrency": 4}, "vllm", "speculation", "ngram", "4 stream(s)", {"speculative_config": {
            "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}}),
    Row("H100, edit workload, 8 streams: off, the batch is full", "hgx-8x-h100", "llama-3-70b", {**EDIT, "concurrency": 8},
        "vllm", "speculation", "off", "8 concurrent sequences > 4 on a GPU", {"speculative_config": None}),
    Row("cpu, free generation, one stream on llama-server: off (measured no gain)", "build-machine", "smollm2",
        {"mode": "production"}, "llama_server", "speculation", "off", "free generation: n-gram lookup finds little to draft",
        {"spec_type": "none"}),
    Row("cpu, edit workload, objective throughput: off", "build-machine", "smollm2", {**EDIT, "objective": "throughput"},
        "llamacpp", "speculation", "off", "has no speculative decoding"),
    Row("H100, edit workload, one stream: vLLM n-gram", "hgx-8x-h100", "llama-3-70b", EDIT,
        "vllm", "speculation", "ngram", "outputs copy the prompt",
        {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                                "prompt_lookup_min": 2}}),
    Row("H100, 64 streams for throughput: off", "hgx-8x-h100", "llama-3-70b",
        {"concurrency": 64, "objective": "throughput", "mode": "production"},
        "tensorrt_llm", "speculation", "off", "objective throughput", {"speculative_config": None}),
    Row("H100, MTP heads in the checkpoint: MTP speculation, free generation too", "hgx-8x-h100", "qwen3-30b-a3b", {},
        "sglang", "speculation", "mtp", "1 multi-token-prediction layer",
        {"speculative_config": {"method": "mtp", "num_speculative_tokens": 1}}, {"mtp_layers": 1}),
    # prefix caching and the host-RAM prompt cache
    Row("H100, shared prefixes: prefix caching on", "hgx-8x-h100", "llama-3-70b",
        {"shared_prefix": True, "concurrency": 16, "mode": "production"},
        "sglang", "prefix_cache", "on", "share prefixes", {"prefix_caching": True}),
    Row("H100, no shared prefixes: engine default", "hgx-8x-h100", "llama-3-70b", {"concurrency": 16, "mode": "production"},
        "vllm", "prefix_cache", "engine default", "no shared prefixes", {"prefix_caching": None}),
    Row("Pi 5, shared prefixes: the prompt cache sized from the RAM left (not 8 GiB)", "raspberry-pi-5", "smollm2",
        {"shared_prefix": True, "concurrency": 2}, "llama_server", "prompt_cache", "1787 MiB",
        "25% of the 7.0 GiB of RAM the plan leaves free", {"cache_ram_mib": 1787, "cache_reuse": 256}),
    Row("cpu, one-shot requests, no shared prefixes: no prompt cache", "build-machine", "smollm2",
        {"concurrency": 2, "requests": "one_shot"}, "llama_server", "prompt_cache", "off",
        "one-shot requests without shared prefixes: evicted prompts would not recur",
        {"cache_ram_mib": 0, "cache_reuse": None}),
    Row("cpu, one-shot requests with shared prefixes: the prompt cache kept", "build-machine", "smollm2",
        {"concurrency": 2, "requests": "one_shot", "shared_prefix": True}, "llama_server", "prompt_cache", "5735 MiB",
        "shared prefixes: prompts evicted", {"cache_ram_mib": 5735, "cache_reuse": 256}),
    Row("Pi 5, conversations (the default): the prompt cache kept and sized", "raspberry-pi-5", "smollm2",
        {"concurrency": 2}, "llama_server", "prompt_cache", "1787 MiB",
        "conversations: each turn resends the conversation so far", {"cache_ram_mib": 1787, "cache_reuse": None}),
    # chunked prefill and batch sizes
    Row("H100, long prompts mixed with decode, latency: 2048-token chunks", "hgx-8x-h100", "llama-3-70b",
        {"prompt_tokens": 6000, "output_tokens": 300, "concurrency": 16, "mode": "production"},
        "vllm", "batching", "2048 tokens per step", "stalls the others' next token", {"max_batched_tokens": 2048}),
    Row("H100, long prompts, throughput: whole prompts per step", "hgx-8x-h100", "llama-3-70b",
        {"prompt_tokens": 6000, "output_tokens": 300, "concurrency": 16, "objective": "throughput", "mode": "production"},
        "tensorrt_llm", "batching", "8192 tokens per step", "whole 6000-token prompts", {"max_batched_tokens": 8192}),
    Row("RTX 3060, llama.cpp, long prompts: a bigger physical batch", "rtx-3060", "llama-3-8b",
        {"prompt_tokens": 1000, "output_tokens": 100, "concurrency": 2}, "llama_server", "batching", "-b 2048 -ub 1024",
        "1024-token physical batch", {"batch_size": 2048, "ubatch_size": 1024}, GGUF_8B),
    Row("cpu, long prompts: llama.cpp's batch sizes kept", "build-machine", "smollm2",
        {"prompt_tokens": 1000, "output_tokens": 100, "concurrency": 2}, "llama_server", "batching", "engine default",
        "not measured on a CPU", {"batch_size": None, "ubatch_size": None}),
    # KV cache type
    Row("H100, fp16 KV would cut the context below a request: fp8", "hgx-8x-h100", "llama-3-70b",
        {"prompt_tokens": 6000, "output_tokens": 2000, "concurrency": 256, "objective": "throughput", "mode": "production"},
        "tensorrt_llm", "kv_cache", "fp8", "fp8 KV holds 8192 tokens of context (fp16: 5632)", {"kv_cache_dtype": "fp8"}),
    Row("A100, fp16 KV cuts the context below a request, but fp8 KV needs Ada/Hopper: fp16", "4x-a100-nvlink",
        "llama-3-70b", {"prompt_tokens": 600_000, "output_tokens": 1000, "objective": "throughput", "mode": "production"},
        "tensorrt_llm", "kv_cache", "fp16", "fp8 KV needs Ada/Hopper", {"kv_cache_dtype": None},
        {"context_length": 1_000_000}),
    Row("Pi 5, 64 long sequences fit only at q8_0", "raspberry-pi-5", "smollm2",
        {"prompt_tokens": 6000, "output_tokens": 2000, "concurrency": 64, "context_length": 8192, "mode": "production"},
        "llama_server", "kv_cache", "q8_0", "KV bytes and fits; measured on a CPU (docs/engine-features.md): 47% less KV "
        "memory, prefill 0.5x", {"kv_cache_type": "q8_0"}),
    Row("RTX 3060, an 8B GGUF at a 64k context in-process: q8_0 KV keeps every layer on the GPU", "rtx-3060",
        "llama-3-8b", {"context_length": 65536}, "llamacpp", "kv_cache", "q8_0",
        "at fp16 the model and its KV overflow GPU memory (layers left in system RAM): q8_0 KV puts every layer on the GPU "
        "(fp16: 19 of 32 layers on the GPU", {"kv_cache_type": "q8_0", "gpu_layers": -1, "context_length": 65536},
        GGUF_8B),
    Row("cpu, the KV fits: fp16", "build-machine", "smollm2", {"concurrency": 2}, "llama_server", "kv_cache", "fp16",
        "fp16 KV holds the context", {"kv_cache_type": "f16"}),
    Row("the workload's own KV type wins", "raspberry-pi-5", "smollm2", {"kv_dtype": "q4_0", "concurrency": 2},
        "llama_server", "kv_cache", "q4_0", "set in the workload", {"kv_cache_type": "q4_0"}),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_feature_decision(row: Row) -> None:
    spec = model(row.model).model_copy(update=row.spec_update)
    p = plan(snapshot(row.host), spec, Workload(**row.workload), installed=ALL)
    assert p.engine == row.engine
    choice, reason = decision(p, row.feature)
    assert choice == row.choice and row.reason in reason, (choice, reason)
    for key, value in row.options.items():
        assert p.options.get(key) == value, (key, p.options.get(key))


def test_fp16_kv_in_process_would_leave_layers_in_system_ram() -> None:
    # the same host and model as the q8_0 row, with fp16 KV fixed by the workload: a partial offload
    spec = model("llama-3-8b").model_copy(update=GGUF_8B)
    p = plan(snapshot("rtx-3060"), spec, Workload(context_length=65536, kv_dtype="fp16"), installed=ALL)
    assert p.engine == "llamacpp" and p.options["gpu_layers"] == 19 and "kv_cache_type" not in p.options
    assert any("the plan chose 'q8_0'" in r for r in p.reasons)


def test_a_production_chat_service_keeps_llama_servers_prompt_cache() -> None:
    # issue 36: `mode: production, concurrency: 4` and nothing else is a multi-turn chat service
    p = plan(snapshot("build-machine"), model("smollm2"), Workload(mode="production", concurrency=4), installed=ALL)
    assert p.engine == "llama_server"
    choice, reason = decision(p, "prompt_cache")
    assert p.options["cache_ram_mib"] > 0 and choice == f"{p.options['cache_ram_mib']} MiB"
    assert "conversations" in reason and "recurs at its next turn" in reason


def test_every_plan_explains_every_feature_for_its_engine() -> None:
    p = plan(snapshot("build-machine"), model("smollm2"), Workload(**EDIT), installed=ALL)
    assert [f.feature for f in p.features] == ["kv_cache", "speculation", "prefix_cache", "prompt_cache", "batching"]
    assert all(f.reason for f in p.features)


def test_the_users_option_wins_and_is_listed_as_an_override() -> None:
    p = plan(snapshot("build-machine"), model("smollm2"), Workload(**EDIT), installed=ALL)
    user = apply_user(p, {"spec_type": "none", "cache_ram_mib": 512}, snapshot("build-machine"))
    assert user.options["spec_type"] == "none" and user.options["cache_ram_mib"] == 512
    assert {(o.option, o.planned, o.chosen) for o in user.overridden} >= {("spec_type", "ngram-simple", "none")}
    assert any("spec_type='none' (set in the config; the plan chose 'ngram-simple')" in r for r in user.reasons)


ENDPOINT = Endpoint("127.0.0.1", 8000, "")


def test_planned_speculation_and_caches_reach_llama_servers_command_line(tmp_path: Any) -> None:
    p = plan(snapshot("raspberry-pi-5"), model("smollm2"), Workload(**EDIT, shared_prefix=True), installed=ALL)
    argv = launch_args(tmp_path / "llama-server", tmp_path / "m.gguf", "m", p.options, ENDPOINT)
    joined = " ".join(argv)
    assert "--spec-type ngram-simple" in joined and "--cache-reuse 256" in joined
    assert f"--cache-ram {p.options['cache_ram_mib']}" in joined


def test_a_named_draft_model_replaces_the_planned_ngram_speculation(tmp_path: Any) -> None:
    argv = launch_args(tmp_path / "s", tmp_path / "m.gguf", "m", {"spec_type": "ngram-simple", "draft_model": "/d.gguf"},
                       ENDPOINT)
    assert "-md" in argv and "--spec-type" not in argv
    with pytest.raises(Exception, match="unknown spec_type"):
        launch_args(tmp_path / "s", tmp_path / "m.gguf", "m", {"spec_type": "ngram-bogus"}, ENDPOINT)


SERVER_FEATURES = {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                                          "prompt_lookup_min": 2},
                   "prefix_caching": True, "max_batched_tokens": 2048}


def test_server_engines_spell_the_features_in_their_own_flags() -> None:
    opts = launch_options(SERVER_FEATURES)
    vllm = vllm_args("/m", "m", opts)
    i = vllm.index("--speculative-config")
    assert '"method": "ngram"' in vllm[i + 1] and "--enable-prefix-caching" in vllm
    assert vllm[vllm.index("--max-num-batched-tokens") + 1] == "2048"
    sglang = sglang_args("/m", "m", opts)
    assert sglang[sglang.index("--speculative-algorithm") + 1] == "NGRAM"
    assert sglang[sglang.index("--chunked-prefill-size") + 1] == "2048" and "--disable-radix-cache" not in sglang
    trt = extra_options(opts)
    assert trt["speculative_config"] == {"decoding_type": "NGram", "max_draft_len": 4, "max_matching_ngram_size": 4}
    assert trt["kv_cache_config"]["enable_block_reuse"] is True and trt["max_num_tokens"] == 2048
    mtp = launch_options({"speculative_config": {"method": "mtp", "num_speculative_tokens": 1}, "prefix_caching": False})
    sglang_mtp = " ".join(sglang_args("/m", "m", mtp))
    assert "--speculative-algorithm NEXTN --speculative-num-draft-tokens 2 --speculative-num-steps 1" in sglang_mtp
    assert "--disable-radix-cache" in sglang_mtp and "--no-enable-prefix-caching" in vllm_args("/m", "m", mtp)
    assert extra_options(mtp)["speculative_config"] == {"decoding_type": "MTP", "num_nextn_predict_layers": 1}


def test_a_bad_speculative_config_is_refused_naming_the_option() -> None:
    with pytest.raises(ValueError, match="options.speculative_config"):
        launch_options({"speculative_config": {"num_speculative_tokens": 2}})
    with pytest.raises(ValueError, match="options.prefix_caching"):
        launch_options({"prefix_caching": "yes"})


def blackwell() -> HardwareSnapshot:
    s = host("hgx-8x-h100")
    assert s.nvidia
    gpus = tuple(g.model_copy(update={"compute_capability": (10, 0)}) for g in s.nvidia.gpus)
    return s.model_copy(update={"nvidia": s.nvidia.model_copy(update={"gpus": gpus})})


FORMATS = [
    ("hgx-8x-h100", "llama-3-70b", {}, "than FP8 (8 bits): Ada/Hopper (compute capability 9.0)", "2.0x fewer bytes"),
    ("4x-a100-nvlink", "llama-3-70b", {}, "than AWQ or GPTQ 4-bit (4.25 bits): Ampere", "3.7x fewer bytes"),
    (blackwell(), "llama-3-70b", {}, "than NVFP4 (4.5 bits): Blackwell", "3.5x fewer bytes"),
    ("build-machine", "llama-3-8b", {}, "than GGUF Q4_K_M (4.85 bits): llama.cpp's K-quant kernels are its fastest on a CPU",
     "fewer bytes"),
    ("build-machine", "smollm2", {}, None, None),  # already a 4-bit GGUF
    ("hgx-8x-h100", "llama-3-70b", {"format": "fp8", "bits_per_weight": 8.0}, None, None),  # FP8 on Hopper: right already
]


@pytest.mark.parametrize(("where", "name", "update", "names", "gain"), FORMATS)
def test_format_advice_names_the_faster_format_and_the_gain(where: Any, name: str, update: dict[str, Any],
                                                            names: str | None, gain: str | None) -> None:
    s = host(where) if isinstance(where, str) else where
    p = plan(s, model(name).model_copy(update=update), Workload(), installed=ALL)
    advice = [w for w in p.warnings if w.startswith("format:")]
    if names is None:
        assert advice == []
    else:
        assert len(advice) == 1 and names in advice[0] and gain in advice[0], advice


def test_an_accelerator_no_probe_covers_is_named_as_present_and_unused() -> None:
    p = plan(host("intel-arc-a770"), model("smollm2"), Workload(), installed=ALL)
    assert p.engine == "llamacpp"  # planned for the CPU, as before
    assert p.notes == ("accelerator present and unused: Intel Corporation DG2 [Arc A770] at 0000:03:00.0 "
                       "(enginegate has no probe or engine for it); this plan runs without it",)
    assert plan(host("build-machine"), model("smollm2"), Workload(), installed=ALL).notes == ()
    assert plan(host("rtx-3060"), model("smollm2"), Workload(), installed=ALL).notes == ()


def test_an_nvidia_card_nvml_did_not_report_is_named() -> None:
    s = host("intel-arc-a770")
    seen = s.pci_devices[0].model_copy(update={"vendor_id": "10de", "vendor": "NVIDIA Corporation", "name": "AD102"})
    notes = plan(s.model_copy(update={"pci_devices": (seen,)}), model("smollm2"), Workload(), installed=ALL).notes
    assert len(notes) == 1 and "NVIDIA Corporation AD102" in notes[0] and "NVML did not report it" in notes[0]


def test_the_workloads_kv_type_wins_and_is_listed_where_the_plan_disagrees() -> None:
    asks = {"prompt_tokens": 6000, "output_tokens": 2000, "concurrency": 256, "objective": "throughput",
            "mode": "production"}
    p = plan(host("hgx-8x-h100"), model("llama-3-70b"), Workload(**asks, kv_dtype="fp16"), installed=ALL)
    assert decision(p, "kv_cache") == ("fp16", "set in the workload (the plan would choose fp8)")
    assert p.options.get("kv_cache_dtype") is None and p.options["context_length"] == 5632
    assert any(r.startswith("user override: kv_dtype='fp16' (set in the workload; the plan chose 'fp8': fp16 KV lowers")
               for r in p.reasons)
    same = plan(host("build-machine"), model("smollm2"), Workload(kv_dtype="fp16"), installed=ALL)
    assert decision(same, "kv_cache") == ("fp16", "set in the workload")
    assert not any(r.startswith("user override") for r in same.reasons)
