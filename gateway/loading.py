"""How configured models become lifecycles: the engines to try in the plan's order, what each
is expected to hold (per memory pool), and the pools' budget.

The first choice is the engine the plan chose (or the user named), with the user's options. The
next ones are the plan's other ranked candidates that are installed and not ruled out here (and,
for an engine that is a mode of another, such as llama_server of llamacpp, that one first): each
planned on its own, with the model's top-level settings (context_length, threads, gpu_layers),
since a model's `options` belong to the engine it names.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from adapters import registry
from adapters.spec import EngineSpec
from gateway import planning
from gateway.config import MemoryBudget, ModelConfig
from gateway.hardware import HardwareSnapshot
from gateway.planning import Plan
from gateway.planning.pools import fast_pools, host_gpus, system_pool
from gateway.routing import Admission, EngineChoice, Replica
from gateway.routing.budget import Charges

log = logging.getLogger("enginegate")

ReplicaBuilder = Callable[[EngineSpec, Plan | None, bool], list[Replica]]
"""(engine, its plan, whether the user's `options` apply) -> the model's replicas on that engine."""


def capacity(snapshot: HardwareSnapshot | None, budget: MemoryBudget) -> dict[str, int]:
    """Pool -> bytes models may hold: the config's figure, else the detected size; unknown pools are not budgeted."""
    pools: dict[str, int] = {}
    ram = budget.ram_bytes
    if ram is None and snapshot is not None:
        system = system_pool(snapshot)
        ram = system.usable_bytes if system.known else None
    if ram is not None:
        pools["ram"] = ram
    if snapshot is not None:
        for gpu in host_gpus(snapshot):
            size = budget.gpu_bytes.get(gpu.index, gpu.memory_bytes)
            if size is not None:
                pools[f"gpu:{gpu.index}"] = size
        unified = [p for p in fast_pools(snapshot) if p.kind == "unified" and p.known]
        if unified:
            pools["unified"] = unified[0].usable_bytes
    if budget.unified_bytes is not None:
        pools["unified"] = budget.unified_bytes
    for index, size in budget.gpu_bytes.items():
        pools[f"gpu:{index}"] = size
    return pools


def charges(plan: Plan | None, path: Path | None) -> Charges:
    """What the model is expected to hold, per pool: the plan's required bytes where it places the model."""
    cap = plan.capacity if plan is not None else None
    if cap is None:
        size = path.stat().st_size if path is not None and path.is_file() else 0
        return {"ram": size} if size else {}
    need = cap.required_bytes
    context = plan.options.get("context_length") if plan is not None else None
    if isinstance(context, int) and cap.context_length and context != cap.context_length:
        # the user's context_length replaced the plan's: its KV cache scales with it
        need = cap.weights_bytes + (need - cap.weights_bytes) * context // cap.context_length
    if cap.memory == "vram":
        gpus = cap.gpus or (0,)
        return {f"gpu:{index}": need // len(gpus) for index in gpus}
    if cap.memory == "unified":
        return {"unified": need}
    return {"ram": need}  # system RAM, or split between GPUs and RAM (counted whole in RAM: the safe side)


def engine_choices(
    plan: Plan | None,
    first: EngineSpec,
    path: Path,
    snapshot: HardwareSnapshot,
    config: ModelConfig,
    build: ReplicaBuilder,
) -> list[EngineChoice]:
    """The engines to try for one model, in order (see the module's docstring)."""
    choices = [EngineChoice(first.name, plan, lambda: build(first, plan, True), charges(plan, path),
                            "chosen by the plan" if config.engine == "auto" else "set in the model's config")]
    if plan is None or not config.fallback:
        return choices
    ruled_out = {r.engine for r in plan.rejected}
    names = ([first.plans_as] if first.plans_as else []) + [c.engine for c in plan.candidates]
    for name in dict.fromkeys(names):
        if name in {c.engine for c in choices} or name in ruled_out or name == plan.engine:
            continue
        try:
            engine = registry.spec(name)
        except registry.UnknownEngineError:
            continue
        if not engine.local_weights or not engine.installed():
            continue
        try:
            alternative = planning.plan(snapshot, planning.load_spec(path), config.workload, requested_engine=name)
        except (planning.SpecError, planning.NoEngineError, ValueError) as exc:
            log.debug("fallback %s for %s not planned: %s", name, path, exc)
            continue
        top = {k: v for k, v in config.model_dump(include={"context_length", "threads", "gpu_layers"},
                                                  exclude_unset=True).items() if v is not None}
        alternative = planning.apply_user(alternative, top, snapshot)
        spec = registry.spec(alternative.engine)
        choices.append(EngineChoice(spec.name, alternative, lambda s=spec, p=alternative: build(s, p, False),
                                    charges(alternative, path), f"next ranked candidate after {first.name}"))
    return choices

