"""What a plan says in words: the capacity figures as reasons and warnings, and the memory
figures a "does not fit" carries."""

from __future__ import annotations

from adapters import registry
from gateway.hardware import HardwareSnapshot
from gateway.planning.capacity import Capacity
from gateway.planning.checkpoint import SOURCE_TEXT
from gateway.planning.options import Layout
from gateway.planning.pools import GPU_MEMORY_FRACTION, fast_pools, host_gpus, system_pool
from gateway.planning.specs import ModelSpec
from gateway.planning.workload import Workload


def gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def weights_line(spec: ModelSpec) -> str | None:
    """The weights' size, where it comes from, and the arithmetic beside a checkpoint's own figure."""
    if spec.weight_bytes is None:
        return None
    arithmetic = spec.arithmetic_bytes
    beside = f" (config arithmetic: {gb(arithmetic)})" if arithmetic and spec.weights_source != "arithmetic" else ""
    return f"{gb(spec.weight_bytes)} from {SOURCE_TEXT[spec.weights_source]}{beside}"


def _b(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def params_line(spec: ModelSpec) -> str | None:
    """Parameters, active ones, and the layer list behind them: the experts' layers, recurrent, sliding, vision."""
    if not spec.params_total:
        return None
    parts = [f"{_b(spec.params_total)} total"]
    if spec.params_active and spec.params_active != spec.params_total:
        parts[0] += f", {_b(spec.params_active)} active per token"
    layers = spec.layers or 0
    if spec.experts:
        held = f"{spec.moe_layers} of {layers} layers" if spec.moe_layers and spec.moe_layers < layers else "every layer"
        parts.append(f"{held} hold {spec.experts} experts ({spec.experts_used or '?'} routed per token)")
    if spec.ssm_layers:
        parts.append(f"{spec.ssm_layers} of {layers} layers hold no per-token KV (linear attention, SSM, cross-attention)")
    if spec.sliding_layers:
        parts.append(f"{spec.sliding_layers} of {layers} layers keep {spec.sliding_window} tokens of KV")
    if spec.vision_params:
        parts.append(f"vision tower and projector {_b(spec.vision_params)}")
    return "; ".join(parts)


def explain(
    engine: str,
    cap: Capacity,
    lay: Layout,
    s: HardwareSnapshot,
    reasons: list[str],
    warnings: list[str],
) -> None:
    where = {
        "vram": f"{cap.devices_used} GPU(s)",
        "unified": "unified memory",
        "system": "system RAM",
        "split": "GPU memory + system RAM",
    }[cap.memory]
    usable = f"{gb(cap.usable_bytes)} usable" if cap.memory_known else "size unknown: not checked"
    kv_total = cap.required_bytes - cap.weights_bytes
    if cap.kv_sizing == "paged":
        per = f" per replica ({cap.replicas} replicas share {cap.concurrency})" if cap.replicas > 1 else ""
        kv_text = (
            f"paged KV {gb(kv_total)} ({cap.sequence_tokens}-token typical sequences x concurrency, "
            f"with room for one at {cap.context_length}, {cap.kv_dtype}){per}"
        )
    else:
        kv_text = f"KV {gb(kv_total)} ({cap.concurrency} x {cap.context_length} tokens reserved, {cap.kv_dtype})"
    reasons.append(
        f"weights {gb(cap.weights_bytes)} + {kv_text} = {gb(cap.required_bytes)}; "
        f"{'fits in' if cap.fit != 'none' else 'exceeds'} {where} ({usable})"
    )
    if lay.gpus > 1 and registry.spec(engine).tensor_parallel:
        if lay.pipeline_parallel > 1 and lay.tensor_parallel > 1:
            reasons.append(
                f"tensor parallel {lay.tensor_parallel} x pipeline {lay.pipeline_parallel}: tensor parallel only "
                "inside an NVLink group and as far as the attention heads divide, pipeline stages across"
            )
        elif lay.tensor_parallel > 1:
            reasons.append(f"the {lay.gpus} GPUs are joined by NVLink/NVSwitch/XGMI: tensor parallel across {lay.tensor_parallel}")
        else:
            reasons.append(
                f"no NVLink/XGMI between the {lay.gpus} GPUs: "
                f"pipeline parallel ({lay.pipeline_parallel} stages) rather than tensor parallel"
            )
    rate = cap.decode_tokens_per_s
    if rate is not None:
        reasons.append(
            f"decode at most ~{rate:.0f} tokens/s per sequence "
            f"({cap.bandwidth_gbps or 0:.0f} GB/s over {gb(cap.bytes_per_token)} read per token: "
            f"weights + KV of {cap.sequence_tokens} tokens)"
        )
    if cap.aggregate_tokens_per_s is not None and cap.concurrency > 1:
        reasons.append(
            f"aggregate decode at most ~{cap.aggregate_tokens_per_s:.0f} tokens/s over {cap.concurrency} "
            "concurrent sequences (one weight read per batched step; capped by compute at 50% of peak where known)"
            + (
                "; RAM bandwidth is `enginegate doctor`'s one-thread copy, so many-core servers may stream faster"
                if cap.memory == "system"
                else ""
            )
        )
    if cap.prefill_seconds is not None:
        reasons.append(
            f"prefill of {cap.prompt_tokens} tokens ~{cap.prefill_seconds * 1000:.0f} ms "
            f"at {cap.prefill_efficiency:.0%} of peak FLOPs"
        )
    has_fast = bool(fast_pools(s))
    speed = (
        f"expect at most about {rate:.0f} tokens/s"
        if rate is not None
        else "run `enginegate doctor` to measure RAM bandwidth and estimate the speed"
    )
    if cap.fit == "system" and has_fast:
        offload = f" ({lay.gpu_layers} layers offloaded to the GPU)" if lay.gpu_layers > 0 else ""
        warnings.append(f"the model fits only in system RAM{offload}: {speed}")
    elif cap.fit == "system" and rate is None:
        warnings.append(f"the model runs from system RAM: {speed}")
    elif cap.fit == "none":
        warnings.append(
            f"the model does not fit in memory ({gb(cap.required_bytes)} needed, {usable}): "
            "loading will fail or swap; use a smaller quantisation or context"
        )
    if cap.fit == "fast" and cap.memory_known and cap.concurrency_at_typical < cap.concurrency:
        warnings.append(
            f"only {cap.concurrency_at_typical} sequences of {cap.sequence_tokens} tokens fit at once, "
            f"not the {cap.concurrency} asked: the rest queue"
        )
    if s.nvidia and any(g.mig_enabled for g in s.nvidia.gpus):
        warnings.append("MIG is enabled: engines see MIG slices, not whole GPUs, and memory figures above are per GPU")


def memory_figures(snapshot: HardwareSnapshot, spec: ModelSpec, w: Workload, context: int, need: int) -> str:
    """Needed against usable, and what would hold it: the numbers a "does not fit" carries."""
    weights = spec.weight_bytes or 0
    typical = w.prompt_tokens + w.output_tokens
    text = (
        f"needs {gb(need)} (weights {gb(weights)} + paged KV {gb(need - weights)} for "
        f"{w.concurrency} x {typical} tokens, one at {context})"
    )
    pools = fast_pools(snapshot)
    ram = system_pool(snapshot)
    have = []
    if pools and not pools[-1].known:
        have.append(f"{pools[-1].devices} GPU(s) of unknown memory")
    elif pools and pools[-1].kind == "vram":
        gpus = host_gpus(snapshot)
        best = max(pools, key=lambda p: p.usable_bytes)
        have.append(f"{best.devices} GPU(s) {gb(best.usable_bytes)} usable")
        largest = max((g.memory_bytes or 0) for g in gpus)
        if largest and need > best.usable_bytes:
            per_gpu = largest * GPU_MEMORY_FRACTION
            k = -(-need // int(per_gpu))
            name = next(g.name for g in gpus if (g.memory_bytes or 0) == largest)
            have.append(f"it would take {k} x {name}" + (" (more GPUs or nodes)" if k > len(gpus) else ""))
    elif pools:
        have.append(f"unified memory {gb(pools[-1].usable_bytes)} usable")
    have.append(f"RAM {gb(ram.usable_bytes)} usable" if ram.known else "RAM unknown")
    return f"{text}; {', '.join(have)}"
