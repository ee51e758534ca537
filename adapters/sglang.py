"""SGLang's server, launched and supervised (engine name `sglang`).

`python -m sglang.launch_server` binds early and warms up: `/health_generate` answers 503 during
warm-up, then runs a one-token generation and answers 200, which is the readiness rule here.
Errors are flat (`{"object": "error", "message", ...}`); the relay nests them. Metrics need
`--enable-metrics`. Several nodes: each runs this command with its `--node-rank`, all pointing
at node 0's `--dist-init-addr`. `options.otlp_traces_endpoint` turns on its own request spans
(`--enable-trace --otlp-traces-endpoint`, see adapters/engine_traces.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adapters import lora
from adapters.base import Capabilities, RequestContext
from adapters.config import EngineConfig
from adapters.engine_server import EngineServer
from adapters.engine_traces import engine_traces, sglang_trace_args
from adapters.launch import (
    LaunchConfigError,
    LaunchOptions,
    flag,
    flag_if_not_default,
    kv_layout_options,
    server_feature_options,
)
from adapters.process import Endpoint, Launch
from adapters.spec import EngineSpec, ServerSpec

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


def engine_args(model_path: str, served: str, opts: LaunchOptions, endpoint: Endpoint | None = None) -> list[str]:
    """SGLang's server arguments (also what Dynamo's SGLang worker takes); with `endpoint`, its address and key."""
    argv = ["--model-path", model_path, "--served-model-name", served]
    if endpoint is not None:
        argv += ["--host", endpoint.host, "--port", str(endpoint.port)]
        if endpoint.api_key:
            argv += ["--api-key", endpoint.api_key]
    flag_if_not_default(argv, "--tp-size", opts.tensor_parallel)
    flag_if_not_default(argv, "--pp-size", opts.pipeline_parallel)
    flag_if_not_default(argv, "--dp-size", opts.data_parallel)
    if opts.nodes > 1:
        argv += ["--nnodes", str(opts.nodes), "--node-rank", str(opts.node_rank), "--dist-init-addr", str(opts.master_addr)]
    flag(argv, "--context-length", opts.context_length)
    flag(argv, "--mem-fraction-static", opts.gpu_memory_fraction)
    flag(argv, "--quantization", opts.quantization)
    flag(argv, "--kv-cache-dtype", opts.kv_cache_dtype)
    argv += speculative_args(opts.speculative_config)
    if opts.prefix_caching is False:
        argv.append("--disable-radix-cache")  # the radix cache is on by default
    flag(argv, "--chunked-prefill-size", opts.max_batched_tokens)
    return argv


SPECULATIVE_ALGORITHMS = {"ngram": "NGRAM", "mtp": "NEXTN", "eagle": "EAGLE", "eagle3": "EAGLE3",
                          "draft_model": "STANDALONE"}
"""vLLM-shaped `speculative_config` methods in SGLang's --speculative-algorithm names."""


def speculative_args(config: Mapping[str, Any] | None) -> list[str]:
    if not config:
        return []
    method = str(config.get("method") or "draft_model")
    algorithm = SPECULATIVE_ALGORITHMS.get(method)
    if algorithm is None:
        raise LaunchConfigError(f"options.speculative_config method {method!r} has no SGLang algorithm; one of "
                                f"{', '.join(SPECULATIVE_ALGORITHMS)}")
    tokens = int(config.get("num_speculative_tokens") or 1)
    argv = ["--speculative-algorithm", algorithm, "--speculative-num-draft-tokens", str(tokens + 1)]
    if algorithm != "NGRAM":
        argv += ["--speculative-num-steps", str(tokens), "--speculative-eagle-topk", "1"]
    if config.get("model"):
        argv += ["--speculative-draft-model-path", str(config["model"])]
    return argv


def sglang_argv(model_path: str, served: str, opts: LaunchOptions, endpoint: Endpoint) -> list[str]:
    argv = opts.python_module(MODULE) + engine_args(model_path, served, opts, endpoint)
    if opts.metrics:
        argv.append("--enable-metrics")
    return argv


def sglang_command(adapter: EngineServer, endpoint: Endpoint) -> Launch:
    argv = sglang_argv(adapter.model_path, adapter.served, adapter.launch_options, endpoint)
    traces = engine_traces(adapter.options)
    return Launch(argv + lora.sglang_args(adapter.loras, adapter.options) + sglang_trace_args(traces),
                  traces.env("sglang") if traces else {})


class SglangServer(EngineServer):
    loads_loras_at_runtime = True  # /load_lora_adapter, /unload_lora_adapter

    async def load_lora(self, adapter: lora.LoraAdapter) -> None:
        await self._lora_call("/load_lora_adapter", {"lora_name": adapter.name, "lora_path": adapter.path},
                              ("already loaded", "already exists"))

    async def unload_lora(self, name: str) -> None:
        await self._lora_call("/unload_lora_adapter", {"lora_name": name}, ())

    def __init__(self, config: EngineConfig, spec: EngineSpec) -> None:
        super().__init__(config, spec)
        if self.config_error is None:
            try:
                lora.sglang_args(self.loras, self.options)
                engine_traces(self.options)
            except ValueError as exc:
                self.config_error = str(exc)

    def select_lora(self, body: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        """SGLang's own field for the adapter (`lora_path`, by its registered name), under the base's model id."""
        if ctx.model in lora.names(self.loras):
            return {**body, "model": self.served, "lora_path": ctx.model}
        return body


SPEC = EngineSpec(
    name="sglang",
    adapter=SglangServer,
    continues=True,
    capabilities=Capabilities(
        chat=True, completions=True, embeddings=True, tools=True, structured_output=True, n_choices=True, logprobs=True, image_input=True, audio_input=True,
    ),
    accelerators=("nvidia", "amd"),
    formats=("bf16", "fp16", "fp8", "awq", "gptq", "compressed-tensors", "bnb", "nvfp4", "mxfp4"),
    min_compute_capability=7.5,
    install_hint="pip install 'sglang[all]'  (NVIDIA GPU; see docs.sglang.ai for ROCm and CPU builds)",
    python_modules=("sglang",),
    layout_options=kv_layout_options,
    feature_options=server_feature_options,
    speculation=("ngram", "mtp"),
    quantized_kv="fp8",
    default_concurrency=64,
    traces=True,
    container_image="lmsysorg/sglang:latest",
    server=ServerSpec(command=sglang_command, ready_path="/health_generate", metrics_map=METRICS, startup_timeout=900.0),
)
