"""Capacity arithmetic: weights, KV cache, fit, concurrency, decode and prefill bounds.

Pure functions of a ModelSpec and numbers; `assess()` combines them for one memory pool.
Units: bytes, tokens, GB/s (1e9 bytes/s), TFLOP/s (1e12 FLOP/s), seconds.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from gateway.planning.specs import ModelSpec

KvDtype = Literal["fp16", "bf16", "fp8", "q8_0", "q4_0"]
KvSizing = Literal["paged", "reserved"]
"""paged: engines that allocate KV in blocks as sequences grow (vLLM, SGLang, TensorRT-LLM, ExLlama's
dynamic generator): sized for the typical sequence x concurrency, with room for one at full context.
reserved: engines that reserve full context per slot up front (llama.cpp, MLX)."""
Fit = Literal["fast", "system", "none"]
MemoryKind = Literal["vram", "unified", "system", "split"]
"""split: GPU memory and system RAM together (a partial offload)."""

# bytes per cached element; GGUF q8_0 / q4_0 store blocks of 32 values in 34 / 18 bytes
KV_DTYPE_BYTES: dict[str, float] = {"fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
PREFILL_EFFICIENCY = 0.5
"""Share of peak dense FLOPs a well-tuned engine reaches on long prefills (we assume 50%)."""


def kv_bytes_per_token(spec: ModelSpec, kv_dtype: KvDtype = "fp16") -> tuple[float, float]:
    """(bytes per token in full-attention layers, bytes per token in sliding-window layers).

    GQA: 2 (K and V) x kv_heads x head_dim x bytes per element, per attention layer.
    MLA: (kv_lora_rank + qk_rope_head_dim) x bytes per element, per layer: the compressed
         latent is cached, not K and V.
    SSM / linear-attention layers keep a fixed-size state and add nothing per token.
    """
    if spec.layers is None:
        raise ValueError(f"{spec.path}: the spec has no layer count, so its KV cache is unknown")
    element = KV_DTYPE_BYTES[kv_dtype]
    if spec.attention == "mla":
        if spec.kv_lora_rank is None or spec.qk_rope_head_dim is None:
            raise ValueError(f"{spec.path}: MLA spec without kv_lora_rank / qk_rope_head_dim")
        per_layer = (spec.kv_lora_rank + spec.qk_rope_head_dim) * element
    else:
        if spec.kv_heads is None or spec.head_dim is None:
            raise ValueError(f"{spec.path}: the spec has no KV head count or head size")
        per_layer = 2 * spec.kv_heads * spec.head_dim * element
    attention_layers = spec.layers - spec.ssm_layers
    sliding = spec.sliding_layers if spec.sliding_window else 0
    return per_layer * (attention_layers - sliding), per_layer * sliding


def kv_bytes(spec: ModelSpec, tokens: int, kv_dtype: KvDtype = "fp16") -> int:
    """KV cache of one sequence holding `tokens` tokens; sliding layers hold at most the window."""
    if tokens < 0:
        raise ValueError("tokens must be >= 0")
    full, windowed = kv_bytes_per_token(spec, kv_dtype)
    window = spec.sliding_window or 0
    return int(full * tokens + windowed * min(tokens, window))


def paged_kv_bytes(spec: ModelSpec, context: int, concurrency: int, typical_tokens: int, kv_dtype: KvDtype) -> int:
    """A paged KV pool for `concurrency` sequences of `typical_tokens`, and at least one at full `context`."""
    typical = min(typical_tokens, context)
    return max(concurrency * kv_bytes(spec, typical, kv_dtype), kv_bytes(spec, context, kv_dtype))


def concurrency_at(room_bytes: int, kv_per_sequence: int) -> int:
    """Sequences of `kv_per_sequence` bytes that a KV pool of `room_bytes` holds (vLLM's "maximum concurrency")."""
    if room_bytes <= 0:
        return 0
    return room_bytes // kv_per_sequence if kv_per_sequence > 0 else 1_000_000


def max_concurrency(budget_bytes: int, weights_bytes: int, kv_per_sequence: int) -> int:
    """Sequences whose KV fits beside the weights: floor((budget - weights) / kv per sequence)."""
    room = budget_bytes - weights_bytes
    if room <= 0:
        return 0
    return room // kv_per_sequence if kv_per_sequence > 0 else 1_000_000


def max_context(
    spec: ModelSpec,
    budget_bytes: int,
    weights_bytes: int,
    concurrency: int,
    kv_dtype: KvDtype,
    limit: int,
    typical_tokens: int | None = None,
) -> int:
    """Largest context <= limit at which `concurrency` sequences fit (KV is monotone: bisect).

    typical_tokens: size as a paged engine does (`paged_kv_bytes`) instead of concurrency x context.
    """
    room = budget_bytes - weights_bytes
    if room <= 0 or concurrency < 1:
        return 0
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        need = (
            kv_bytes(spec, mid, kv_dtype) * concurrency
            if typical_tokens is None
            else paged_kv_bytes(spec, mid, concurrency, typical_tokens, kv_dtype)
        )
        if need <= room:
            lo = mid
        else:
            hi = mid - 1
    return lo


def decode_tokens_per_s(segments: list[tuple[float, float]]) -> float:
    """Upper bound on one sequence's decode rate: 1 / sum(bytes_i / bandwidth_i).

    Each token reads every segment once (weights on the GPU, weights left in RAM, the KV
    cache); `segments` is a list of (bytes read per token, bandwidth in GB/s).
    """
    seconds = sum(b / (bw * 1e9) for b, bw in segments if b > 0)
    if seconds <= 0:
        raise ValueError("decode bound needs at least one segment with bytes > 0")
    return 1.0 / seconds


def prefill_seconds(
    active_params: int, prompt_tokens: int, peak_tflops: float, efficiency: float = PREFILL_EFFICIENCY
) -> float:
    """2 x active params x prompt tokens FLOPs, at `efficiency` of peak dense FLOP/s."""
    if peak_tflops <= 0 or not 0 < efficiency <= 1:
        raise ValueError("peak_tflops must be > 0 and efficiency in (0, 1]")
    return 2 * active_params * prompt_tokens / (peak_tflops * 1e12 * efficiency)


class MemoryPool(BaseModel):
    """One place the model could live: a set of GPUs, unified memory, or system RAM."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: MemoryKind
    devices: int
    usable_bytes: int
    """What an engine that shards evenly (tensor or pipeline parallel) can use: devices x the smallest."""
    bandwidth_gbps: float | None
    """Bandwidth one sequence's decode sees (per device; multiplied by tensor parallelism)."""
    peak_tflops: float | None
    linked: bool = False
    """All devices joined by NVLink/NVSwitch/XGMI, so tensor parallelism pays off."""
    split_bytes: int = 0
    """What an engine that splits layers by each device's memory can use (llama.cpp): the sum."""
    known: bool = True
    """False when the memory size could not be read: fit is assumed, not checked."""
    indexes: tuple[int, ...] = ()
    """The GPUs in this pool."""
    tensor_parallel: int = 1
    pipeline_parallel: int = 1


class Capacity(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    weights_bytes: int
    active_weights_bytes: int
    kv_dtype: KvDtype
    kv_bytes_per_token: float
    """Per token, full-attention layers (sliding-window layers stop growing at the window)."""
    context_length: int
    concurrency: int
    kv_bytes_per_sequence: int
    required_bytes: int
    fit: Fit
    memory: MemoryKind
    devices_used: int
    usable_bytes: int
    max_concurrency: int
    max_context: int
    tensor_parallel: int
    bandwidth_gbps: float | None
    decode_tokens_per_s: float | None
    """Upper bound for one sequence at `sequence_tokens` tokens of KV; null when bandwidth is unknown."""
    sequence_tokens: int
    bytes_per_token: int
    """Bytes one decode step reads: active weights + the KV of `sequence_tokens` tokens."""
    prefill_seconds: float | None
    prompt_tokens: int
    prefill_efficiency: float = PREFILL_EFFICIENCY
    kv_sizing: KvSizing = "reserved"
    kv_pool_bytes: int = 0
    """Memory left for KV beside the weights (per replica)."""
    concurrency_at_typical: int = 0
    """Sequences of `sequence_tokens` (the typical prompt + output) the KV pool holds at once."""
    concurrency_at_full: int = 0
    """Sequences at the full `context_length` the KV pool holds at once."""
    replicas: int = 1
    """Data-parallel copies of the model (each on `devices_used` GPUs)."""
    gpus: tuple[int, ...] = ()
    """GPUs the plan uses (all replicas)."""
    free_gpus: tuple[int, ...] = ()
    """GPUs the plan leaves free."""
    aggregate_tokens_per_s: float | None = None
    """Upper bound on decode tokens/s summed over `concurrency` sequences batched together (all replicas)."""
    memory_known: bool = True


def assess(
    spec: ModelSpec,
    pool: MemoryPool,
    *,
    fit: Fit,
    context_length: int,
    concurrency: int,
    kv_dtype: KvDtype,
    prompt_tokens: int,
    output_tokens: int,
    tensor_parallel: int = 1,
    offload: tuple[float, float | None] | None = None,
    sizing: KvSizing = "reserved",
    replicas: int = 1,
) -> Capacity:
    """Figures for `spec` placed in `pool`.

    offload: (share of weights left in system RAM, RAM bandwidth GB/s) for a partial GPU
    offload; those bytes are read at RAM speed.
    """
    weights = spec.weight_bytes
    if weights is None:
        raise ValueError(f"{spec.path}: weight size unknown (no files and no parameter count)")
    active = spec.active_weight_bytes or weights
    kv_seq = kv_bytes(spec, context_length, kv_dtype)
    seq_tokens = min(context_length, prompt_tokens + output_tokens)
    per_token_kv = kv_bytes(spec, seq_tokens, kv_dtype)
    decode = None
    bandwidth = None if pool.bandwidth_gbps is None else pool.bandwidth_gbps * tensor_parallel
    if bandwidth is not None:
        if offload is not None:
            share, ram_bw = offload
            if ram_bw is not None:
                decode = decode_tokens_per_s(
                    [(active * (1 - share) + per_token_kv, bandwidth), (active * share, ram_bw)]
                )
        else:
            decode = decode_tokens_per_s([(active + per_token_kv, bandwidth)])
    prefill = None
    if pool.peak_tflops and spec.params_active:
        prefill = prefill_seconds(spec.params_active, prompt_tokens, pool.peak_tflops * tensor_parallel)
    full, _ = kv_bytes_per_token(spec, kv_dtype)
    per_replica = -(-concurrency // replicas)
    kv_total = (
        paged_kv_bytes(spec, context_length, per_replica, seq_tokens, kv_dtype)
        if sizing == "paged"
        else kv_seq * per_replica
    )
    room = pool.usable_bytes - weights
    aggregate = None
    if bandwidth is not None and offload is None:
        batch = max(1, min(per_replica, concurrency_at(room, per_token_kv) if pool.known else per_replica))
        step = (active + batch * per_token_kv) / (bandwidth * 1e9)
        aggregate = batch / step * replicas
        if pool.peak_tflops and spec.params_active:  # compute ceiling: 2 FLOPs per active weight per token
            ceiling = pool.peak_tflops * tensor_parallel * 1e12 * PREFILL_EFFICIENCY / (2 * spec.params_active)
            aggregate = min(aggregate, ceiling * replicas)
    return Capacity(
        weights_bytes=weights,
        active_weights_bytes=active,
        kv_dtype=kv_dtype,
        kv_bytes_per_token=full,
        context_length=context_length,
        concurrency=concurrency,
        kv_bytes_per_sequence=kv_seq,
        required_bytes=weights + kv_total,
        kv_sizing=sizing,
        kv_pool_bytes=max(0, room),
        concurrency_at_typical=concurrency_at(room, per_token_kv),
        concurrency_at_full=concurrency_at(room, kv_seq),
        replicas=replicas,
        aggregate_tokens_per_s=aggregate,
        memory_known=pool.known,
        fit=fit,
        memory=pool.kind,
        devices_used=pool.devices,
        usable_bytes=pool.usable_bytes,
        max_concurrency=max_concurrency(pool.usable_bytes, weights, kv_seq),
        max_context=max_context(
            spec, pool.usable_bytes, weights, concurrency, kv_dtype, max(context_length, spec.context_length or 0)
        ),
        tensor_parallel=tensor_parallel,
        bandwidth_gbps=bandwidth,
        decode_tokens_per_s=decode,
        sequence_tokens=seq_tokens,
        bytes_per_token=active + per_token_kv,
        prefill_seconds=prefill,
        prompt_tokens=prompt_tokens,
    )
