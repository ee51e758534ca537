"""How many GPUs a paged engine gets, by objective, and which stay free.

- the fewest GPUs that hold the weights and the paged KV pool: local use, and objective cost;
- production and fleet serving also keep at least half of the set's memory for KV
  (`PRODUCTION_WEIGHT_SHARE`), growing the tensor-parallel group inside an NVLink/NVSwitch
  domain (pipeline stages across PCIe) until they do: a KV pool of a few sequences starves
  continuous batching;
- objective throughput: as many data-parallel replicas of that set as the host holds.
GPUs outside the plan are named free.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.hardware import HardwareSnapshot
from gateway.planning.capacity import MemoryPool
from gateway.planning.pools import Gpu, holds, host_gpus
from gateway.planning.workload import Workload

PRODUCTION_WEIGHT_SHARE = 0.5
"""In production, weights may take at most this share of the GPUs' usable memory; the rest is KV."""


@dataclass(frozen=True)
class GpuChoice:
    pool: MemoryPool
    replicas: int
    gpus: tuple[int, ...]
    """Every GPU used, all replicas."""
    free: tuple[int, ...]
    why: str


def _replica_sets(gpus: list[Gpu], pool: MemoryPool, count: int) -> list[tuple[int, ...]]:
    """Up to `count` disjoint sets shaped like `pool`: the pool's own first, then others as large."""
    smallest = min((g.memory_bytes or 0) for g in gpus if g.index in pool.indexes)
    size = len(pool.indexes)
    sets = [pool.indexes]
    used = set(pool.indexes)
    by_domain: dict[int, list[int]] = {}
    for g in sorted(gpus, key=lambda g: g.index):
        if g.index not in used and (g.memory_bytes or 0) >= smallest:
            by_domain.setdefault(g.domain, []).append(g.index)
    tp = pool.tensor_parallel
    spare: list[int] = []
    for members in by_domain.values():
        while len(members) >= tp and len(sets) < count:
            group, members = members[:tp], members[tp:]
            spare += group
            if len(spare) == size:
                sets.append(tuple(sorted(spare)))
                spare = []
    return sets[:count]


def divisible(pool: MemoryPool, heads: int | None) -> MemoryPool:
    """The pool with a tensor-parallel size that divides the attention heads (vLLM and SGLang require it);
    the rest of its GPUs become pipeline stages."""
    tp = pool.tensor_parallel
    if not heads or heads % tp == 0:
        return pool
    t = max(d for d in range(1, tp + 1) if tp % d == 0 and heads % d == 0)
    return pool.model_copy(
        update={"tensor_parallel": t, "pipeline_parallel": pool.devices // t, "linked": t == pool.devices and t > 1}
    )


def choose_gpus(
    snapshot: HardwareSnapshot,
    pools: list[MemoryPool],
    need: int,
    weights: int,
    w: Workload,
    heads: int | None = None,
) -> GpuChoice | None:
    """The GPU set (and replicas) for a paged engine needing `need` bytes per replica; None if none holds it."""
    fitting = [divisible(p, heads) for p in pools if p.kind == "vram" and holds(p, need)]
    if not fitting:
        return None
    pool = fitting[0]
    why = f"the fewest GPUs that hold weights and KV: {pool.devices}"
    serving = w.mode in ("production", "fleet") and w.objective != "cost"
    if serving:
        roomy = [p for p in fitting if not p.known or weights <= PRODUCTION_WEIGHT_SHARE * p.usable_bytes]
        if roomy and roomy[0].devices > pool.devices:
            pool = roomy[0]
            why = (
                f"{w.mode} serving keeps at least half of GPU memory for the KV cache: "
                f"{pool.devices} GPUs rather than the {fitting[0].devices} that barely hold the weights"
            )
        elif not roomy and fitting[-1].devices > pool.devices:
            pool = fitting[-1]
            why = f"{w.mode} serving: all {pool.devices} GPUs, for the most KV room (weights take over half)"
    gpus = host_gpus(snapshot)
    replicas = 1
    sets: list[tuple[int, ...]] = [pool.indexes]
    if w.objective == "throughput" and len(gpus) >= 2 * pool.devices:
        sets = _replica_sets(gpus, pool, len(gpus) // pool.devices)
        replicas = len(sets)
        if replicas > 1:
            why += f"; objective throughput: {replicas} data-parallel replicas of {pool.devices} GPU(s)"
    used = tuple(sorted(i for s in sets for i in s))
    free = tuple(sorted(g.index for g in gpus if g.index not in used))
    return GpuChoice(pool=pool, replicas=replicas, gpus=used, free=free, why=why)
