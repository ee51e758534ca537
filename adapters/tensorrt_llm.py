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
from typing import Any, ClassVar

import yaml

from adapters.base import Capabilities
from adapters.engine_server import EngineServer
from adapters.launch import LaunchOptions, flag, flag_if_not_default
from adapters.process import Endpoint, Launch
from gateway.config import ModelConfig

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
    if opts.metrics:
        extra["return_perf_metrics"] = True
        extra["enable_iter_perf_stats"] = True
    return extra


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


class TensorRTLLMAdapter(EngineServer):
    engine = "tensorrt_llm"
    capabilities = Capabilities(
        chat=True, completions=True, embeddings=False, responses=True, tools=True, structured_output=True,
        n_choices=True, logprobs=True,
    )
    container_image = "nvcr.io/nvidia/tensorrt-llm/release:latest"
    install_hint = ("pip install tensorrt_llm --extra-index-url https://pypi.nvidia.com  (NVIDIA GPU only), "
                    "or run the container " "nvcr.io/nvidia/tensorrt-llm/release")
    program_name = PROGRAM
    ready_path = "/health_generate"
    metrics_path: ClassVar[str | None] = "/prometheus/metrics"
    metrics_map: ClassVar[Mapping[str, str]] = METRICS
    uses_api_key = False
    default_startup_timeout = 1800.0  # the tensorrt backend builds engines on first start

    def __init__(self, model: ModelConfig, options: dict[str, Any]) -> None:
        super().__init__(model, options)
        self.upstream_model = Path(self.model_path).name  # type: ignore[misc]
        self.backend = str(self.options.get("backend", "pytorch"))

    def command(self, endpoint: Endpoint) -> Launch:
        extra = extra_options(self.launch_options)
        extra_file: str | None = None
        if extra:
            path = self.run_dir() / "extra_llm_api_options.yaml"
            path.write_text(yaml.safe_dump(extra, sort_keys=True))
            extra_file = str(path)
        return Launch(trtllm_argv(self.model_path, self.launch_options, endpoint, self.backend, extra_file))
