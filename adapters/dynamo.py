"""NVIDIA Dynamo: its OpenAI frontend plus one engine worker, both supervised (engine name `dynamo`).

    python -m dynamo.frontend --http-host H --http-port P      (the port the gateway relays to)
    python -m dynamo.<worker> ...                                vllm | sglang | trtllm | mocker

The worker registers the model with the frontend through a discovery backend. By default both
use the file backend (`--discovery-backend file`, `DYN_FILE_KV` = a directory this adapter
owns) with the TCP request plane and ZMQ event plane, so one host needs no etcd or NATS; set
`options.discovery_backend: etcd` (and run etcd + NATS) for a cluster. The frontend's `/health`
says healthy with no worker at all, so readiness is: the served model id appears in
`/v1/models` (before that, chat is a bare 404). The worker has no port of its own to probe:
it counts as up while it runs, and the frontend's readiness covers the rest.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

from adapters import sglang, vllm
from adapters.base import Capabilities, ClientRequestError, Completion, EngineError, Health, RequestContext, StreamEvent
from adapters.config import EngineConfig
from adapters.engine_server import EngineServer
from adapters.launch import LaunchConfigError, LaunchOptions, flag, flag_if_not_default, kv_layout_options, strings
from adapters.process import Endpoint, Launch, ManagedProcess, ProcessError, ProcessState
from adapters.spec import EngineSpec, Layout, ServerSpec

WORKERS = ("vllm", "sglang", "trtllm", "mocker")
PROBE_TIMEOUT = 30.0  # the one-token readiness request
METRICS: Mapping[str, str] = {
    "requests_running": "dynamo_frontend_inflight_requests",
    "requests_waiting": "dynamo_frontend_queued_requests",
    # a histogram of prompt lengths: its _sum is the prompt-token total (seen on the 1.6.1 frontend)
    "prompt_tokens_total": "dynamo_frontend_input_sequence_tokens_sum",
    "generation_tokens_total": "dynamo_frontend_output_tokens_total",
    "ttft_seconds_sum": "dynamo_frontend_time_to_first_token_seconds_sum",
    "ttft_seconds_count": "dynamo_frontend_time_to_first_token_seconds_count",
}


def plane_args(discovery: str) -> list[str]:
    if discovery == "file":
        return ["--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq"]
    return ["--discovery-backend", discovery]


def frontend_argv(opts: LaunchOptions, endpoint: Endpoint, discovery: str, router_mode: str | None) -> list[str]:
    argv = opts.python_module("dynamo.frontend")
    argv += ["--http-host", endpoint.host, "--http-port", str(endpoint.port)]
    flag(argv, "--router-mode", router_mode)
    return argv + plane_args(discovery)


def worker_argv(worker: str, model_path: str, served: str, opts: LaunchOptions, discovery: str,
                program: list[str] | None = None) -> list[str]:
    """`program` replaces `python -m dynamo.<worker>` (options.worker_executable)."""
    argv = list(program) if program else [opts.python, "-m", f"dynamo.{worker}"]
    if worker == "mocker":
        argv += ["--model-path", model_path, "--model-name", served]
    elif worker == "vllm":  # vLLM's own engine arguments
        argv += vllm.engine_args(model_path, served, opts)
    elif worker == "sglang":  # SGLang's server arguments
        argv += sglang.engine_args(model_path, served, opts)
    elif worker == "trtllm":  # dynamo.trtllm's own flags (1.6.1: --model; --model-path is obsolete)
        argv += ["--model", model_path, "--served-model-name", served]
        flag_if_not_default(argv, "--tensor-parallel-size", opts.tensor_parallel)
        flag_if_not_default(argv, "--pipeline-parallel-size", opts.pipeline_parallel)
        flag(argv, "--max-seq-len", opts.context_length)
        flag(argv, "--free-gpu-memory-fraction", opts.gpu_memory_fraction)
    else:
        raise ValueError(f"options.worker must be one of {', '.join(WORKERS)}, got {worker!r}")
    return argv + plane_args(discovery)


def layout_options(lay: Layout) -> dict[str, Any]:
    return {**kv_layout_options(lay), "worker": "vllm", "router_mode": "kv" if lay.shared_prefix else "round-robin"}


IMAGES: Mapping[str, str] = {
    "vllm": "nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.6.1",
    "sglang": "nvcr.io/nvidia/ai-dynamo/sglang-runtime:1.6.1",
    "trtllm": "nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:1.6.1",
}


class DynamoAdapter(EngineServer):
    def __init__(self, config: EngineConfig, spec: EngineSpec) -> None:
        super().__init__(config, spec)
        self.worker = str(self.options.get("worker", "vllm"))
        self.discovery = str(self.options.get("discovery_backend", "file"))
        self.router_mode = self.options.get("router_mode")
        self.container_image = IMAGES.get(self.worker, self.container_image)
        try:
            self.worker_program = list(strings(self.options, "worker_executable"))
            self.worker_args = list(strings(self.options, "worker_args"))
        except LaunchConfigError as exc:
            self.config_error = self.config_error or str(exc)
            self.worker_program, self.worker_args = [], []
        self.worker_process = self._new_process(self.launch_worker, role="worker")

    def _env(self) -> dict[str, str]:
        if self.discovery != "file":
            return {}
        return {"DYN_FILE_KV": str(self.run_dir("discovery"))}

    def command(self, endpoint: Endpoint) -> Launch:
        """The frontend, the process the gateway relays to."""
        return Launch(frontend_argv(self.launch_options, endpoint, self.discovery, self.router_mode), self._env())

    def launch_worker(self, endpoint: Endpoint) -> Launch:
        argv = worker_argv(self.worker, self.model_path, self.served, self.launch_options, self.discovery,
                           self.worker_program)
        return Launch(argv + self.worker_args, {**self._env(), **self.launch_options.env})

    async def ready(self, process: ManagedProcess, endpoint: Endpoint) -> bool:
        """Ready when a request would succeed: the frontend lists the served model (a worker
        registered it) and a one-token request through it answers 200 (the frontend lists a
        (re)started worker's model seconds before it can serve it).

        The worker has no port to probe: at start-up (no frontend yet) it counts as up while it
        runs; restarted under a serving frontend, it is ready by the same rule."""
        if process is not self.process:  # the worker (ready() is called only once it runs)
            return await self._serves_through_frontend()
        if self.worker_process.state is ProcessState.FAILED:
            raise ProcessError(f"the dynamo.{self.worker} worker failed: {self.worker_process.detail}")
        return await self._serves(endpoint)

    async def _serves_through_frontend(self) -> bool:
        frontend = self.process
        if frontend.state is not ProcessState.READY or frontend.endpoint is None:
            return True  # start-up: the frontend's own readiness waits for the model
        return await self._serves(frontend.endpoint)

    async def _serves(self, endpoint: Endpoint) -> bool:
        if self.served not in await self.listed_models(endpoint):
            return False
        probe = {"model": self.served, "max_tokens": 1, "messages": [{"role": "user", "content": "ready?"}]}
        try:
            async with asyncio.timeout(PROBE_TIMEOUT):
                await self.relay.complete(self._upstream_for(endpoint), "/v1/chat/completions", probe,
                                          RequestContext("readiness-probe", self.served))
        except (EngineError, ClientRequestError, TimeoutError):
            return False
        return True

    async def health(self) -> Health:
        worker = self.worker_process
        if worker.state is not ProcessState.READY:
            return Health(False, f"worker {worker.state.value}" + (f": {worker.detail}" if worker.detail else ""))
        return await super().health()

    async def _forward(self, path: str, body: dict[str, Any], ctx: RequestContext,
                       process: ManagedProcess | None = None) -> Completion | AsyncIterator[StreamEvent]:
        """Requests wait for a restarting worker as they wait for a restarting frontend."""
        try:
            await self.worker_process.wait_ready(self.ready_wait)
        except ProcessError as exc:
            raise EngineError(str(exc), 503, "engine_unavailable") from exc
        return await super()._forward(path, body, ctx, process)

    def check(self) -> None:
        super().check()
        if self.worker not in WORKERS:
            raise EngineError(f"options.worker must be one of {', '.join(WORKERS)}, got {self.worker!r}", 503,
                              "invalid_engine_options")

    async def start(self) -> None:
        self.check()
        try:
            await self.worker_process.start()
        except ProcessError as exc:
            raise EngineError(str(exc), 503, "engine_start_failed") from exc
        try:
            await super().start()
        except BaseException:
            await self.worker_process.stop()
            raise

    async def stop(self) -> None:
        try:
            await super().stop()
        finally:
            await self.worker_process.stop()
            self.remove_run_dir()  # the discovery folder, once the worker that writes to it is gone

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info["worker"] = {"kind": self.worker, "state": self.worker_process.state.value, "pid": self.worker_process.pid}
        return info


SPEC = EngineSpec(
    name="dynamo",
    adapter=DynamoAdapter,
    capabilities=Capabilities(chat=True, completions=True, embeddings=False, tools=True, structured_output=True,
                              image_input=True, audio_input=True),
    accelerators=("nvidia",),
    formats=("bf16", "fp16", "fp8", "awq", "gptq", "compressed-tensors", "bnb", "nvfp4", "mxfp4"),
    min_compute_capability=8.0,
    install_hint=("pip install 'ai-dynamo[vllm]'  (or [sglang], [trtllm]); on a host where that fails: "
                  "pip install ai-dynamo-runtime && pip install --no-deps ai-dynamo"),
    python_modules=("dynamo",),
    layout_options=layout_options,
    default_concurrency=64,
    container_image=IMAGES["vllm"],
    server=ServerSpec(ready_path=None, metrics_map=METRICS, uses_api_key=False, startup_timeout=900.0),
)
