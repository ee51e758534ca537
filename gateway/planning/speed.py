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


def _gpu_kinds(snapshot: HardwareSnapshot, on_gpus: bool) -> list[tuple[str, float, float, int]]:
    """(name, bandwidth GB/s, memory bytes, count on this host) of the GPUs to propose, best first.

    This host's largest GPU kind when the plan does not already run on it, then the reference GPU.
    """
    kinds = []
    gpus = [g for g in host_gpus(snapshot) if g.figures.memory_bandwidth_gbps and g.memory_bytes]
    if gpus and not on_gpus:
        g = max(gpus, key=lambda g: (g.memory_bytes or 0, g.figures.memory_bandwidth_gbps or 0))
        count = sum(1 for x in gpus if x.name == g.name)
        kinds.append((g.name, float(g.figures.memory_bandwidth_gbps or 0), float(g.memory_bytes or 0), count))
    ref = figures_for(REFERENCE_GPU)
    if ref.memory_bandwidth_gbps and ref.memory_gb:
        kinds.append((REFERENCE_GPU, ref.memory_bandwidth_gbps, ref.memory_gb * 1e9, 0))
    return kinds


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
    alt_engine = next(
        (e for e in GPU_ENGINES if e in book.engines and spec.format in book.engines[e].formats), None
    )
    if alt_engine is None:
        return text
    for name, bandwidth, memory, here in _gpu_kinds(snapshot, on_gpus=cap.memory == "vram"):
        k = 1
        while k < 64 and cap.required_bytes > k * memory * GPU_MEMORY_FRACTION:
            k *= 2
        # llama.cpp splits layers over GPUs and runs them in turn: one GPU's bandwidth, not k
        parallel = 1 if alt_engine == "llamacpp" else k
        alt = decode_tokens_per_s([(cap.bytes_per_token, bandwidth * parallel)])
        if alt <= rate * 1.2:
            continue
        why = "; ".join(dict.fromkeys(r.detail for r in rejected if r.engine == alt_engine))
        rejected_here = f" (rejected here: {why})" if why else ""
        layout = "all layers on the GPU" if k == 1 else "tensor parallel" if parallel > 1 else "layers split over them"
        whose = f", this host has {here}" if here else ""
        return (
            f"{text}; faster: {alt_engine} on {k} x {name} ({layout}, {_gb(cap.required_bytes)} needed{whose}) "
            f"would give ~{alt:.0f} tokens/s{rejected_here}"
        )
    return text


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"
