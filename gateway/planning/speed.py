"""Fit is not speed: warn when the decode bound is below what the workload needs, with the faster
placement the rules rejected and its figures.

The alternative is GPUs: this host's largest kind when it has GPUs, else a reference datacenter
GPU (`REFERENCE_GPU`) from the hardware table. Its bound is bandwidth x k / bytes read per token
for the fewest k (1, 2, 4...) whose memory holds the weights and the KV, tensor parallel across them.
"""

from __future__ import annotations

from gateway.hardware import HardwareSnapshot
from gateway.hardware.figures import figures_for
from gateway.planning.capacity import Capacity, decode_tokens_per_s
from gateway.planning.pools import GPU_MEMORY_FRACTION, host_gpus
from gateway.planning.selection import Rejection, RuleBook
from gateway.planning.specs import ModelSpec

DEFAULT_NEEDED_TOKENS_PER_S = 10.0
"""Per-sequence decode rate assumed needed when the workload names none: a little faster than people read."""
REFERENCE_GPU = "NVIDIA H100 80GB HBM3"
GPU_ENGINES = ("vllm", "sglang", "tensorrt_llm", "exllamav3", "exllamav2", "llamacpp")


def _gpu_kind(snapshot: HardwareSnapshot) -> tuple[str, float, float] | None:
    """(name, bandwidth GB/s, memory bytes) of the GPU to propose."""
    gpus = [g for g in host_gpus(snapshot) if g.figures.memory_bandwidth_gbps and g.memory_bytes]
    if gpus:
        g = max(gpus, key=lambda g: (g.memory_bytes or 0, g.figures.memory_bandwidth_gbps or 0))
        return g.name, float(g.figures.memory_bandwidth_gbps or 0), float(g.memory_bytes or 0)
    ref = figures_for(REFERENCE_GPU)
    if ref.memory_bandwidth_gbps and ref.memory_gb:
        return REFERENCE_GPU, ref.memory_bandwidth_gbps, ref.memory_gb * 1e9
    return None


def slow_warning(
    spec: ModelSpec,
    cap: Capacity,
    engine: str,
    needed: float | None,
    snapshot: HardwareSnapshot,
    book: RuleBook,
    rejected: list[Rejection],
) -> str | None:
    rate = cap.decode_tokens_per_s
    need = needed or DEFAULT_NEEDED_TOKENS_PER_S
    if rate is None or rate >= need:
        return None
    text = (
        f"fits, but decodes at most ~{rate:.1f} tokens/s per sequence, below the {need:g} tokens/s "
        f"{'the workload needs' if needed else 'assumed needed (set decode_tokens_per_s in the workload)'}"
    )
    kind = _gpu_kind(snapshot)
    alt_engine = next(
        (e for e in GPU_ENGINES if e in book.engines and spec.format in book.engines[e].formats), None
    )
    if kind is None or alt_engine is None:
        return text
    name, bandwidth, memory = kind
    per_token = cap.bytes_per_token
    k = 1
    while k < 64 and cap.required_bytes > k * memory * GPU_MEMORY_FRACTION:
        k *= 2
    alt = decode_tokens_per_s([(per_token, bandwidth * k)])
    if alt <= rate * 1.2 or (engine == alt_engine and cap.memory == "vram" and cap.devices_used >= k):
        return text
    why = "; ".join(dict.fromkeys(r.detail for r in rejected if r.engine == alt_engine))
    here = f" (rejected here: {why})" if why else ""
    layout = "tensor parallel" if k > 1 else "all layers on the GPU"
    return (
        f"{text}; faster: {alt_engine} on {k} x {name} ({layout}, {_gb(cap.required_bytes)} needed) "
        f"would give ~{alt:.0f} tokens/s{here}"
    )


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"
