"""Format advice: where the checkpoint reads more bytes per token than a format this hardware
accelerates, name that format and the decode gain its smaller weights buy (the bandwidth bound).

FP8 on Ada/Hopper (compute capability 8.9, 9.x), NVFP4 on Blackwell (10.x, 12.x), 4-bit AWQ/GPTQ
with Marlin kernels on Ampere (8.x), K-quant GGUF on CPUs and Apple silicon. The gain is the ratio
of bytes read per token (weights at the new width + the same KV), an upper bound like the rest.
"""

from __future__ import annotations

from gateway.hardware import HardwareSnapshot
from gateway.planning.capacity import Capacity
from gateway.planning.specs import ModelSpec

WIDE = frozenset({"bf16", "fp16", "fp32"})
GGUF_WIDE = frozenset({"F32", "F16", "BF16", "Q8_0"})
MIN_GAIN = 1.2
"""Advice below this gain is noise next to the engines' own differences: not given."""


def _better(spec: ModelSpec, snapshot: HardwareSnapshot) -> tuple[str, float, str] | None:
    """(format, bits per weight, why this hardware runs it fast) for this checkpoint, or None."""
    gpus = snapshot.nvidia.gpus if snapshot.nvidia else ()
    ccs = [g.compute_capability for g in gpus if g.compute_capability]
    fmt = spec.format
    if ccs:
        major, minor = min(ccs)
        cc = major + minor / 10
        if cc >= 10 and fmt in WIDE | {"fp8"}:
            return "NVFP4", 4.5, f"Blackwell (compute capability {cc:.1f}) has FP4 tensor cores"
        if cc >= 8.9 and fmt in WIDE:
            return "FP8", 8.0, f"Ada/Hopper (compute capability {cc:.1f}) has FP8 tensor cores"
        if cc >= 8.0 and fmt in WIDE:
            return "AWQ or GPTQ 4-bit", 4.25, f"Ampere (compute capability {cc:.1f}) runs them with Marlin kernels"
        return None
    if snapshot.amd and snapshot.amd.gpus:
        return None
    if fmt in WIDE | {"fp8", "awq", "gptq", "compressed-tensors", "bnb"} or (
        fmt == "gguf" and (spec.quantization or "").upper() in GGUF_WIDE
    ):
        where = "Apple silicon" if snapshot.apple else "a CPU"
        return "GGUF Q4_K_M", 4.85, f"llama.cpp's K-quant kernels are its fastest on {where}"
    return None


def format_advice(spec: ModelSpec, snapshot: HardwareSnapshot, cap: Capacity) -> str | None:
    better = _better(spec, snapshot)
    weights = spec.active_weight_bytes
    if better is None or not weights or not spec.bits_per_weight or not cap.bytes_per_token:
        return None
    name, bits, why = better
    if bits >= spec.bits_per_weight:
        return None
    kv = max(0, cap.bytes_per_token - weights)
    smaller = weights * bits / spec.bits_per_weight + kv
    gain = cap.bytes_per_token / smaller
    if gain < MIN_GAIN:
        return None
    rate = f" (~{cap.decode_tokens_per_s:.0f} -> ~{cap.decode_tokens_per_s * gain:.0f} tokens/s)" if cap.decode_tokens_per_s else ""
    return (f"format: this {spec.format} checkpoint ({spec.bits_per_weight:g} bits per weight) is slower here than "
            f"{name} ({bits:g} bits): {why}; decode reads {gain:.1f}x fewer bytes per token{rate}")
