"""Where a model can live on a host: GPU sets, unified memory, system RAM."""

from __future__ import annotations

from gateway.hardware import HardwareSnapshot
from gateway.planning.capacity import Fit, MemoryPool

GPU_MEMORY_FRACTION = 0.9
"""Share of each GPU's memory an engine may claim (vLLM's default --gpu-memory-utilization)."""
UNIFIED_GPU_FRACTION = 0.75
"""Share of unified memory macOS lets the GPU wire by default (recommendedMaxWorkingSetSize)."""


def _counts(n: int) -> list[int]:
    sizes = [k for k in (1, 2, 4, 8, 16, 32) if k < n]
    return [*sizes, n] if n else []


def fast_pools(snapshot: HardwareSnapshot, fraction: float = GPU_MEMORY_FRACTION) -> list[MemoryPool]:
    """Candidate fast-memory pools, smallest first: 1, 2, 4... GPUs, or unified memory."""
    pools: list[MemoryPool] = []
    if snapshot.nvidia and snapshot.nvidia.gpus:
        gpus = sorted(snapshot.nvidia.gpus, key=lambda g: g.index)
        for n in _counts(len(gpus)):
            used = gpus[:n]
            if any(g.memory_total_bytes is None for g in used):
                break
            indexes = {g.index for g in used}
            linked = n > 1 and all(indexes - {g.index} <= set(g.nvlink_peers) for g in used)
            bws = [g.figures.memory_bandwidth_gbps for g in used]
            flops = [g.figures.peak_dense_tflops for g in used]
            pools.append(
                MemoryPool(
                    kind="vram",
                    devices=n,
                    usable_bytes=int(n * min(g.memory_total_bytes or 0 for g in used) * fraction),
                    bandwidth_gbps=None if None in bws else min(b for b in bws if b is not None),
                    peak_tflops=None if None in flops else min(f for f in flops if f is not None),
                    linked=linked,
                )
            )
    elif snapshot.amd and snapshot.amd.gpus:
        gpus_amd = sorted(snapshot.amd.gpus, key=lambda g: g.index)
        for n in _counts(len(gpus_amd)):
            used_amd = gpus_amd[:n]
            if any(g.memory_total_bytes is None for g in used_amd):
                break
            bws = [g.figures.memory_bandwidth_gbps for g in used_amd]
            flops = [g.figures.peak_dense_tflops for g in used_amd]
            pools.append(
                MemoryPool(
                    kind="vram",
                    devices=n,
                    usable_bytes=int(n * min(g.memory_total_bytes or 0 for g in used_amd) * fraction),
                    bandwidth_gbps=None if None in bws else min(b for b in bws if b is not None),
                    peak_tflops=None if None in flops else min(f for f in flops if f is not None),
                    linked=n > 1 and all(g.link_type == "XGMI" for g in used_amd),
                )
            )
    elif snapshot.apple and snapshot.apple.unified_memory_bytes:
        pools.append(
            MemoryPool(
                kind="unified",
                devices=1,
                usable_bytes=int(snapshot.apple.unified_memory_bytes * UNIFIED_GPU_FRACTION),
                bandwidth_gbps=snapshot.apple.figures.memory_bandwidth_gbps,
                peak_tflops=snapshot.apple.figures.peak_dense_tflops,
            )
        )
    return pools


def system_pool(snapshot: HardwareSnapshot) -> MemoryPool:
    mem = snapshot.memory
    return MemoryPool(
        kind="system",
        devices=1,
        usable_bytes=mem.available_bytes or mem.total_bytes or 0,
        bandwidth_gbps=snapshot.cpu.measured_bandwidth_gbps,
        peak_tflops=None,
    )


def place(
    snapshot: HardwareSnapshot, required_bytes: int, fraction: float = GPU_MEMORY_FRACTION
) -> tuple[MemoryPool, Fit]:
    """The smallest fast pool that holds `required_bytes`, else system RAM, else nothing."""
    pools = fast_pools(snapshot, fraction)
    for pool in pools:
        if required_bytes <= pool.usable_bytes:
            return pool, "fast"
    ram = system_pool(snapshot)
    if required_bytes <= ram.usable_bytes:
        return ram, "system"
    if pools and pools[-1].kind == "vram" and required_bytes <= pools[-1].usable_bytes + ram.usable_bytes:
        # llama.cpp keeps the layers that fit on the GPUs and the rest in RAM
        split = ram.model_copy(update={"kind": "split", "usable_bytes": pools[-1].usable_bytes + ram.usable_bytes})
        return split, "system"
    return (pools[-1] if pools else ram), "none"
