"""The user's explicit settings over a plan: they win, and the plan says where it disagreed.

`apply_user(plan, user, snapshot)` merges with `adapters.config.resolve_options` (the one
precedence rule: engine defaults < plan < user), records every planned value the user replaced,
and warns where a user's value contradicts what the host has (more GPUs than there are, a
context beyond the model's trained length, more threads than cores).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from adapters.config import resolve_options
from gateway.hardware import HardwareSnapshot

if TYPE_CHECKING:
    from gateway.planning.plan import Plan


class OptionOverride(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    option: str
    planned: Any
    chosen: Any

    def describe(self) -> str:
        return f"{self.option}={self.chosen!r} (set in the config; the plan chose {self.planned!r})"


def _gpus(snapshot: HardwareSnapshot) -> int:
    if snapshot.nvidia and snapshot.nvidia.gpus:
        return len(snapshot.nvidia.gpus)
    if snapshot.amd and snapshot.amd.gpus:
        return len(snapshot.amd.gpus)
    return 0


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def hardware_warnings(user: Mapping[str, Any], snapshot: HardwareSnapshot, trained_context: int | None) -> list[str]:
    """Where a value the user set cannot hold on this host (it is still used: the user's setting wins)."""
    warnings: list[str] = []
    gpus = _gpus(snapshot)
    tp, pp = _int(user.get("tensor_parallel")), _int(user.get("pipeline_parallel"))
    nodes = _int(user.get("nodes")) or 1
    world = (tp or 1) * (pp or 1)
    if (tp or pp) and world > 1 and world > gpus * nodes:
        have = f"{gpus} GPU(s)" if gpus else "no GPU"
        warnings.append(
            f"tensor_parallel {tp or 1} x pipeline_parallel {pp or 1} = {world} GPUs set in the config, "
            f"but this host has {have}" + (f" on each of {nodes} nodes" if nodes > 1 else "")
            + ": the engine will fail to start or wait for devices"
        )
    context = _int(user.get("context_length"))
    if context and trained_context and context > trained_context:
        warnings.append(f"context_length {context} set in the config exceeds the model's trained "
                        f"{trained_context} tokens: quality may drop")
    threads = _int(user.get("threads"))
    cores = snapshot.cpu.logical_cores
    if threads and cores and threads > cores:
        warnings.append(f"threads {threads} set in the config exceeds this host's {cores} logical cores: "
                        "the threads will contend")
    layers = _int(user.get("gpu_layers"))
    if layers and gpus == 0 and not snapshot.apple:
        warnings.append(f"gpu_layers {layers} set in the config, but this host has no GPU: every layer runs on the CPU")
    return warnings


def apply_user(plan: Plan, user: Mapping[str, Any], snapshot: HardwareSnapshot) -> Plan:
    """The plan with the user's explicit settings over its options, the overrides recorded and warned about."""
    resolved = resolve_options({}, plan.options, user)
    overridden = tuple(OptionOverride(option=o.option, planned=o.planned, chosen=o.chosen) for o in resolved.overridden)
    trained = plan.spec.context_length if plan.spec is not None else None
    warnings = (*plan.warnings, *hardware_warnings(user, snapshot, trained))
    reasons = (*plan.reasons, *(f"user override: {o.describe()}" for o in overridden))
    return plan.model_copy(update={"options": resolved.options, "overridden": overridden, "warnings": warnings,
                                   "reasons": reasons})
