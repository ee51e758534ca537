"""The KV cache type's arithmetic: what fp16 KV costs the workload, whether a quantised plan is better,
and what quantised KV costs in turn (pure; plan.py re-plans with the chosen type)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.planning.capacity import Capacity
from gateway.planning.explain import gb
from gateway.planning.workload import Workload

if TYPE_CHECKING:
    from gateway.planning.plan import Plan

FP8_KV_MIN_COMPUTE_CAPABILITY = 8.9
"""fp8 KV caches run natively from Ada (8.9) and Hopper (9.0) on."""


def kv_limit(p: Plan, w: Workload) -> str | None:
    """What fp16 KV costs what the workload asks (its context, its sequences, fast memory), or None.

    A trained context lowered to fit is no limit while the workload's own sequences still fit in it."""
    cap = p.capacity
    if cap is None or not cap.memory_known:
        return None
    typical = w.prompt_tokens + w.output_tokens
    if cap.fit == "none":
        return f"fp16 KV does not fit ({gb(cap.required_bytes)} needed, {gb(cap.usable_bytes)} usable)"
    if cap.fit == "system" and p.profile is not None and p.profile.accelerator != "none":
        return "at fp16 the model and its KV overflow GPU memory (layers left in system RAM)"
    if cap.context_length < typical:
        return f"fp16 KV lowers the context to {cap.context_length} tokens, below the {typical} a request needs"
    if cap.concurrency_at_typical < w.concurrency:
        return f"at fp16 only {cap.concurrency_at_typical} of the {w.concurrency} sequences asked fit at once"
    return None


def fp8_supported(compute_capability: float | None) -> bool:
    return compute_capability is not None and compute_capability >= FP8_KV_MIN_COMPUTE_CAPABILITY


def better(small: Capacity, full: Capacity) -> bool:
    """The quantised plan fits faster memory, more sequences at once, or more context than the fp16 one.

    Both partly in system RAM (a partial offload whose weights alone overflow the GPU): only more context
    counts, since the few layers the smaller KV brings onto the GPU leave decode bound by the ones in RAM."""
    rank = {"none": 0, "system": 1, "fast": 2}
    if small.fit == full.fit == "system":
        return small.context_length > full.context_length
    return (rank[small.fit], small.concurrency_at_typical, small.context_length) > (
        rank[full.fit], full.concurrency_at_typical, full.context_length)


def bought(dtype: str, full: Plan, small: Plan) -> str:
    """What the quantised plan buys against the fp16 one: the layers it brings onto the GPU (a partial
    offload engine such as llama.cpp), then the context and the sequences at once."""
    a, b = full.capacity, small.capacity
    assert a is not None and b is not None
    held = (f"{dtype} KV holds {b.context_length} tokens of context (fp16: {a.context_length}) and "
            f"{b.concurrency_at_typical} sequences of {b.sequence_tokens} tokens at once (fp16: {a.concurrency_at_typical})")
    if a.fit == "system" and b.fit == "fast":
        on_gpu = full.options.get("gpu_layers")
        layers = full.spec.layers if full.spec is not None else None
        fp16 = (f"{on_gpu} of {layers} layers on the GPU, the rest decoding from system RAM"
                if isinstance(on_gpu, int) and on_gpu >= 0 and layers else "part of the model in system RAM")
        where = f"{dtype} KV puts every layer on the GPU (fp16: {fp16})"
        return where if b.context_length == a.context_length else f"{where}; {held}"
    return held


Q8_KV_ON_CPU = "measured on a CPU (docs/engine-features.md): 47% less KV memory, prefill 0.5x, decode 1.1x"


def kv_cost(dtype: str, p: Plan) -> str:
    """What quantised KV costs: a little accuracy, and on a CPU (measured) prefill speed."""
    cpu = p.profile is not None and p.profile.accelerator == "none"
    measured = f"{Q8_KV_ON_CPU}; " if dtype == "q8_0" and cpu else ""
    return f"{measured}quantised KV costs a little accuracy (set kv_dtype: fp16 in the workload to keep it)"
