"""Engine options for a decided placement, in each engine's own vocabulary."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from gateway.planning.capacity import KvDtype


class Layout(BaseModel):
    """How the model is spread: GPUs used, tensor x pipeline parallel sizes, offload."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    gpus: int
    tensor_parallel: int
    pipeline_parallel: int
    gpu_layers: int
    """-1: every layer on the GPU(s); 0: CPU only."""
    gpu_memory_fraction: float
    context_length: int
    concurrency: int
    kv_dtype: KvDtype
    threads: int | None
    shared_prefix: bool
    data_parallel: int = 1
    """Replicas of the whole model (vLLM --data-parallel-size, SGLang --dp-size)."""


_LLAMACPP_KV = {"fp16": "f16", "bf16": "bf16", "fp8": "q8_0", "q8_0": "q8_0", "q4_0": "q4_0"}
_EXLLAMA_KV = {"fp16": "FP16", "bf16": "FP16", "fp8": "Q8", "q8_0": "Q8", "q4_0": "Q4"}
_SERVER_KV = {"fp16": "auto", "bf16": "auto", "fp8": "fp8", "q8_0": "fp8", "q4_0": "fp8"}


def engine_options(engine: str, lay: Layout) -> dict[str, Any]:
    base: dict[str, Any] = {"context_length": lay.context_length}
    if engine == "llamacpp":
        opts = {
            **base,
            "threads": lay.threads,
            "gpu_layers": lay.gpu_layers,
            "parallel": lay.concurrency,
            "kv_cache_type": _LLAMACPP_KV[lay.kv_dtype],
        }
        if lay.gpus > 1:
            opts["split_mode"] = "layer"  # llama.cpp splits by layers across GPUs (a pipeline), never tensor parallel
        return opts
    if engine == "mlx":
        return {**base, "decode_concurrency": lay.concurrency}
    # Server engines share one vocabulary (adapters/launch.py), turned into each engine's flags there.
    server = {
        **base,
        "tensor_parallel": lay.tensor_parallel,
        "pipeline_parallel": lay.pipeline_parallel,
        "gpu_memory_fraction": lay.gpu_memory_fraction,
        "max_concurrency": lay.concurrency,
    }
    if lay.data_parallel > 1:
        server["data_parallel"] = lay.data_parallel
    if engine in ("exllamav2", "exllamav3"):
        return {**server, "kv_cache_dtype": _EXLLAMA_KV[lay.kv_dtype].lower(), "gpus": lay.gpus}
    if engine == "vllm":
        return {**server, "kv_cache_dtype": _SERVER_KV[lay.kv_dtype], "enable_prefix_caching": lay.shared_prefix}
    if engine == "sglang":
        return {**server, "kv_cache_dtype": _SERVER_KV[lay.kv_dtype]}
    if engine == "tensorrt_llm":
        return server
    if engine == "dynamo":
        return {**server, "worker": "vllm", "router_mode": "kv" if lay.shared_prefix else "round-robin"}
    raise KeyError(f"no options mapping for engine {engine!r}")
