"""TensorRT-LLM's `trtllm-serve`, launched and supervised (engine name `tensorrt_llm`).

Quirks handled here or by the relay: no API-key or served-name flag (the engine's model id is
the model directory's basename, so the relay sends that id upstream); readiness is
`/health_generate` (a one-token generation) answering 200; `/metrics` is JSON iteration stats,
the Prometheus text is at `/prometheus/metrics` once perf metrics are on; the first stream chunk
ends with a space before the blank line. KV-cache dtype and perf metrics go into the
`--extra_llm_api_options` YAML this adapter writes. Several nodes run under `mpirun` through
`trtllm-llmapi-launch`, started from node 0 with `options.hosts`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from adapters.base import Capabilities
from adapters.engine_server import EngineServer
from adapters.launch import LaunchOptions, flag, flag_if_not_default, server_feature_options, server_layout_options
from adapters.process import Endpoint, Launch
from adapters.spec import EngineSpec, Layout, ServerSpec

PROGRAM = "trtllm-serve"
METRICS: Mapping[str, str] = {
    "requests_running": "trtllm_num_requests_running",
    "requests_waiting": "trtllm_num_requests_waiting",
    "kv_cache_usage_ratio": "trtllm_kv_cache_utilization",
    "prompt_tokens_total": "trtllm_prompt_tokens_total",
    "generation_tokens_total": "trtllm_generation_tokens_total",
    "ttft_seconds_sum": "trtllm_time_to_first_token_seconds_sum",
    "ttft_seconds_count": "trtllm_time_to_first_token_seconds_count",
}


def extra_options(opts: LaunchOptions) -> dict[str, Any]:
    """The LLM API options trtllm-serve has no flag for."""
    extra: dict[str, Any] = {}
    if opts.kv_cache_dtype:
        extra["kv_cache_config"] = {"dtype": opts.kv_cache_dtype}
    speculative = opts.speculative_config
    if speculative:
        method = str(speculative.get("method") or "draft_model")
        tokens = int(speculative.get("num_speculative_tokens") or 1)
        if method == "ngram":
            extra["speculative_config"] = {"decoding_type": "NGram", "max_draft_len": tokens,
                                           "max_matching_ngram_size": int(speculative.get("prompt_lookup_max") or 2)}
        elif method == "mtp":
            extra["speculative_config"] = {"decoding_type": "MTP", "num_nextn_predict_layers": tokens}
        else:
            extra["speculative_config"] = {"decoding_type": "Eagle" if method.startswith("eagle") else "DraftTarget",
                                           "max_draft_len": tokens, "speculative_model_dir": speculative.get("model")}
    if opts.prefix_caching is not None:
        extra.setdefault("kv_cache_config", {})["enable_block_reuse"] = opts.prefix_caching
    if opts.max_batched_tokens is not None:
        extra["enable_chunked_prefill"] = True
        extra["max_num_tokens"] = opts.max_batched_tokens
    if opts.metrics:
        extra["return_perf_metrics"] = True
        extra["enable_iter_perf_stats"] = True
    return extra


def layout_options(lay: Layout) -> dict[str, Any]:
    """The server options; the KV cache dtype only where the planner quantises it (fp8), else the engine's own."""
    options = server_layout_options(lay)
    if lay.kv_dtype in ("fp8", "q8_0", "q4_0"):
        options["kv_cache_dtype"] = "fp8"
    return options


def trtllm_argv(model_path: str, opts: LaunchOptions, endpoint: Endpoint, backend: str,
                extra_file: str | None) -> list[str]:
    argv: list[str] = []
    if opts.nodes > 1:
        per_node = max(opts.world_size // opts.nodes, 1)
        hosts = ",".join(f"{h}:{per_node}" for h in opts.hosts)
        argv += ["mpirun", "--allow-run-as-root", "-n", str(opts.world_size)]
        if hosts:
            argv += ["-H", hosts]
        argv.append("trtllm-llmapi-launch")
    argv += opts.program([PROGRAM])
    argv += [model_path, "--host", endpoint.host, "--port", str(endpoint.port), "--backend", backend]
    flag_if_not_default(argv, "--tp_size", opts.tensor_parallel)
    flag_if_not_default(argv, "--pp_size", opts.pipeline_parallel)
    flag(argv, "--max_seq_len", opts.context_length)
    flag(argv, "--kv_cache_free_gpu_memory_fraction", opts.gpu_memory_fraction)
    flag(argv, "--extra_llm_api_options", extra_file)
    return argv


def trtllm_command(adapter: EngineServer, endpoint: Endpoint) -> Launch:
    extra = extra_options(adapter.launch_options)
    extra_file: str | None = None
    if extra:
        path = adapter.run_dir() / "extra_llm_api_options.yaml"
        path.write_text(yaml.safe_dump(extra, sort_keys=True))
        extra_file = str(path)
    backend = str(adapter.options.get("backend", "pytorch"))
    return Launch(trtllm_argv(adapter.model_path, adapter.launch_options, endpoint, backend, extra_file))


SPEC = EngineSpec(
    name="tensorrt_llm",
    adapter=EngineServer,
    capabilities=Capabilities(
        chat=True, completions=True, embeddings=False, responses=True, tools=True, structured_output=True,
        n_choices=True, logprobs=True, image_input=True, audio_input=True,
    ),
    accelerators=("nvidia",),
    formats=("bf16", "fp16", "fp8", "awq", "gptq", "nvfp4", "mxfp4"),
    min_compute_capability=8.0,
    install_hint=("pip install tensorrt_llm --extra-index-url https://pypi.nvidia.com  (NVIDIA GPU only), "
                  "or run the container nvcr.io/nvidia/tensorrt-llm/release"),
    programs=(PROGRAM,),
    layout_options=layout_options,
    feature_options=server_feature_options,
    speculation=("ngram", "mtp"),
    quantized_kv="fp8",
    default_concurrency=64,
    container_image="nvcr.io/nvidia/tensorrt-llm/release:latest",
    server=ServerSpec(
        command=trtllm_command,
        ready_path="/health_generate",
        metrics_path="/prometheus/metrics",
        metrics_map=METRICS,
        uses_api_key=False,
        upstream_model=lambda config: Path(config.source).name,  # trtllm-serve names the model by its directory
        startup_timeout=1800.0,  # the tensorrt backend builds engines on first start
    ),
)
