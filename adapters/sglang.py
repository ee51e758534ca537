"""SGLang's server, launched and supervised (engine name `sglang`).

`python -m sglang.launch_server` binds early and warms up: `/health_generate` answers 503 during
warm-up, then runs a one-token generation and answers 200, which is the readiness rule here.
Errors are flat (`{"object": "error", "message", ...}`); the relay nests them. Metrics need
`--enable-metrics`. Several nodes: each runs this command with its `--node-rank`, all pointing
at node 0's `--dist-init-addr`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from adapters.base import Capabilities
from adapters.engine_server import EngineServer
from adapters.launch import LaunchOptions, flag, flag_if_not_default
from adapters.process import Endpoint, Launch

MODULE = "sglang.launch_server"
METRICS: Mapping[str, str] = {
    "requests_running": "sglang:num_running_reqs",
    "requests_waiting": "sglang:num_queue_reqs",
    "kv_cache_usage_ratio": "sglang:token_usage",
    "prompt_tokens_total": "sglang:prompt_tokens_total",
    "generation_tokens_total": "sglang:generation_tokens_total",
    "ttft_seconds_sum": "sglang:time_to_first_token_seconds_sum",
    "ttft_seconds_count": "sglang:time_to_first_token_seconds_count",
}


def sglang_argv(model_path: str, served: str, opts: LaunchOptions, endpoint: Endpoint) -> list[str]:
    argv = opts.python_module(MODULE)
    argv += ["--model-path", model_path, "--served-model-name", served, "--host", endpoint.host,
             "--port", str(endpoint.port)]
    if endpoint.api_key:
        argv += ["--api-key", endpoint.api_key]
    flag_if_not_default(argv, "--tp-size", opts.tensor_parallel)
    flag_if_not_default(argv, "--pp-size", opts.pipeline_parallel)
    if opts.nodes > 1:
        argv += ["--nnodes", str(opts.nodes), "--node-rank", str(opts.node_rank), "--dist-init-addr", str(opts.master_addr)]
    flag(argv, "--context-length", opts.context_length)
    flag(argv, "--mem-fraction-static", opts.gpu_memory_fraction)
    flag(argv, "--quantization", opts.quantization)
    flag(argv, "--kv-cache-dtype", opts.kv_cache_dtype)
    if opts.metrics:
        argv.append("--enable-metrics")
    return argv


class SGLangAdapter(EngineServer):
    engine = "sglang"
    capabilities = Capabilities(
        chat=True, completions=True, embeddings=True, tools=True, structured_output=True, n_choices=True, logprobs=True,
    )
    container_image = "lmsysorg/sglang:latest"
    install_hint = "pip install 'sglang[all]'  (NVIDIA GPU; see docs.sglang.ai for ROCm and CPU builds)"
    python_module = MODULE
    ready_path = "/health_generate"
    metrics_map: ClassVar[Mapping[str, str]] = METRICS
    default_startup_timeout = 900.0

    def command(self, endpoint: Endpoint) -> Launch:
        return Launch(sglang_argv(self.model_path, self.served, self.launch_options, endpoint))
