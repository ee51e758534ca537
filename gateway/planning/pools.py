"""Where a model can live on a host: GPU sets (with their parallel layout), unified memory, system RAM.

GPU sets are chosen as engines use them: tensor parallelism shards every layer evenly, so a
tensor-parallel group holds n x its smallest card; pipeline stages split layers evenly in vLLM
and SGLang (n x the smallest card too), while llama.cpp splits layers in proportion to each
card's memory (`split_bytes`, the sum). Sets are filled largest card first, and inside one
NVLink/NVSwitch/XGMI domain when one holds enough GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.hardware import HardwareSnapshot
from gateway.hardware.models import DeviceFigures
from gateway.planning.capacity import Fit, MemoryPool

GPU_MEMORY_FRACTION = 0.9
"""Share of each GPU's memory an engine may claim (vLLM's default --gpu-memory-utilization)."""
UNIFIED_GPU_FRACTION = 0.75
"""Share of unified memory macOS lets the GPU wire by default (recommendedMaxWorkingSetSize)."""
INTEGRATED_MARKERS = ("nvgpu", "orin", "tegra", "gb10")
"""NVML names of GPUs that share the system's memory (Jetson, DGX Spark): no VRAM of their own."""


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_bytes: int | None
    """NVML's figure, else the datasheet's (`memory_source` says which), else None: unknown."""
    memory_source: str
    figures: DeviceFigures
    domain: int
    """GPUs with the same domain are joined by NVLink/NVSwitch/XGMI (each GPU alone is its own domain)."""


def _domains(peers: dict[int, set[int]]) -> dict[int, int]:
    """Connected components of the link graph, named by their smallest index."""
    domain: dict[int, int] = {}
    for start in sorted(peers):
        if start in domain:
            continue
        stack = [start]
        while stack:
            i = stack.pop()
            if i in domain:
                continue
            domain[i] = start
            stack += [p for p in peers.get(i, ()) if p in peers]
    return domain


def host_gpus(snapshot: HardwareSnapshot) -> list[Gpu]:
    """The host's discrete GPUs (NVIDIA, else AMD) with memory and link domain."""
    raw: list[tuple[int, str, int | None, DeviceFigures, set[int]]] = []
    if snapshot.nvidia and snapshot.nvidia.gpus:
        raw = [(g.index, g.name, g.memory_total_bytes, g.figures, set(g.nvlink_peers)) for g in snapshot.nvidia.gpus]
    elif snapshot.amd and snapshot.amd.gpus:
        xgmi = {g.index for g in snapshot.amd.gpus if g.link_type == "XGMI"}
        raw = [
            (g.index, g.name, g.memory_total_bytes, g.figures, (xgmi - {g.index}) if g.index in xgmi else set())
            for g in snapshot.amd.gpus
        ]
    domain = _domains({index: peers for index, _, _, _, peers in raw})
    gpus = []
    for index, name, memory, figures, _ in raw:
        source = "driver"
        if memory is None and figures.memory_gb:
            memory, source = int(figures.memory_gb * 1e9), "datasheet"
        elif memory is None and any(m in name.lower() for m in INTEGRATED_MARKERS) and snapshot.memory.total_bytes:
            memory, source = snapshot.memory.total_bytes, "system RAM (integrated GPU)"
        elif memory is None:
            source = "unknown"
        gpus.append(Gpu(index, name, memory, source, figures, domain[index]))
    return gpus


def _counts(n: int) -> list[int]:
    sizes = [k for k in (1, 2, 4, 8, 16, 32, 64) if k < n]
    return [*sizes, n] if n else []


def _choose(gpus: list[Gpu], n: int) -> tuple[list[Gpu], int]:
    """n GPUs, largest memory first, inside one linked domain if one is big enough; and the TP size."""
    def size(g: Gpu) -> int:
        return g.memory_bytes or 0

    by_domain: dict[int, list[Gpu]] = {}
    for g in sorted(gpus, key=lambda g: (-size(g), g.index)):
        by_domain.setdefault(g.domain, []).append(g)
    inside = [members[:n] for members in by_domain.values() if len(members) >= n]
    if inside and n > 1:
        best = max(inside, key=lambda chosen: (min(size(g) for g in chosen), -chosen[0].index))
        return best, n
    if n == 1:
        return [max(gpus, key=lambda g: (size(g), -g.index))], 1
    chosen = sorted(gpus, key=lambda g: (-size(g), g.index))[:n]
    groups = {len(by_domain[g.domain]) for g in chosen}
    width = groups.pop() if len(groups) == 1 else 1  # equal NVLink islands: TP inside each, PP across
    if width > 1 and n % width == 0 and all(sum(1 for c in chosen if c.domain == g.domain) == width for g in chosen):
        return chosen, width
    return chosen, 1


def gpu_pools(snapshot: HardwareSnapshot, fraction: float = GPU_MEMORY_FRACTION) -> list[MemoryPool]:
    """Candidate GPU sets, smallest first (1, 2, 4, 8... GPUs, then all of them)."""
    gpus = host_gpus(snapshot)
    pools: list[MemoryPool] = []
    for n in _counts(len(gpus)):
        chosen, tp = _choose(gpus, n)
        known = all(g.memory_bytes is not None for g in chosen)
        smallest = min((g.memory_bytes or 0) for g in chosen)
        bws = [g.figures.memory_bandwidth_gbps for g in chosen]
        flops = [g.figures.peak_dense_tflops for g in chosen]
        pools.append(
            MemoryPool(
                kind="vram",
                devices=n,
                usable_bytes=int(n * smallest * fraction) if known else 0,
                split_bytes=int(sum(g.memory_bytes or 0 for g in chosen) * fraction) if known else 0,
                known=known,
                bandwidth_gbps=None if None in bws else min(b for b in bws if b is not None),
                peak_tflops=None if None in flops else min(f for f in flops if f is not None),
                linked=tp == n and n > 1,
                indexes=tuple(sorted(g.index for g in chosen)),
                tensor_parallel=tp,
                pipeline_parallel=n // tp,
            )
        )
    return pools


def fast_pools(snapshot: HardwareSnapshot, fraction: float = GPU_MEMORY_FRACTION) -> list[MemoryPool]:
    """Candidate fast-memory pools, smallest first: GPU sets, or unified memory."""
    pools = gpu_pools(snapshot, fraction)
    if pools:
        return pools
    if snapshot.apple:
        total = snapshot.apple.unified_memory_bytes or snapshot.memory.total_bytes
        usable = int(total * UNIFIED_GPU_FRACTION) if total else 0
        return [
            MemoryPool(
                kind="unified",
                devices=1,
                usable_bytes=usable,
                split_bytes=usable,
                known=total is not None,
                bandwidth_gbps=snapshot.apple.figures.memory_bandwidth_gbps,
                peak_tflops=snapshot.apple.figures.peak_dense_tflops,
            )
        ]
    return []


def system_pool(snapshot: HardwareSnapshot) -> MemoryPool:
    mem = snapshot.memory
    usable = mem.available_bytes or mem.total_bytes
    return MemoryPool(
        kind="system",
        devices=1,
        usable_bytes=usable or 0,
        split_bytes=usable or 0,
        known=usable is not None,
        bandwidth_gbps=snapshot.cpu.measured_bandwidth_gbps,
        peak_tflops=None,
    )


def holds(pool: MemoryPool, required_bytes: int, split: bool = False) -> bool:
    """Does `pool` hold `required_bytes`? A pool of unknown size is assumed to (the plan warns)."""
    return not pool.known or required_bytes <= (pool.split_bytes if split else pool.usable_bytes)


def place(
    snapshot: HardwareSnapshot, required_bytes: int, fraction: float = GPU_MEMORY_FRACTION, split: bool = False
) -> tuple[MemoryPool, Fit]:
    """The smallest fast pool that holds `required_bytes`, else system RAM, else GPUs + RAM, else nothing.

    split: the engine splits layers in proportion to each GPU's memory (llama.cpp).
    """
    pools = fast_pools(snapshot, fraction)
    for pool in pools:
        if holds(pool, required_bytes, split):
            return pool, "fast"
    ram = system_pool(snapshot)
    if holds(ram, required_bytes):
        return ram, "system"
    if pools and pools[-1].kind == "vram" and required_bytes <= pools[-1].split_bytes + ram.usable_bytes:
        # llama.cpp keeps the layers that fit on the GPUs and the rest in RAM
        together = pools[-1].split_bytes + ram.usable_bytes
        return ram.model_copy(update={"kind": "split", "usable_bytes": together, "split_bytes": together}), "system"
    return (pools[-1] if pools else ram), "none"
