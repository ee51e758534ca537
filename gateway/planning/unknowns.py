"""What the planner could not read about the host or the model, as warnings naming what was assumed."""

from __future__ import annotations

from gateway.hardware import HardwareSnapshot
from gateway.hardware.figures import near_match
from gateway.planning.pools import host_gpus
from gateway.planning.specs import ModelSpec

NO_NVIDIA_STACK = ("library not found", "nvidia-ml-py is not installed", "not found")
"""NVML errors that mean "no NVIDIA software here" (a host without NVIDIA GPUs), not a broken probe."""


def _nvidia_probe(snapshot: HardwareSnapshot) -> list[str]:
    out = []
    for issue in snapshot.issues:
        if issue.probe != "nvidia" or snapshot.nvidia is not None:
            continue
        if any(marker in issue.reason.lower() for marker in NO_NVIDIA_STACK):
            continue
        out.append(
            f"the NVIDIA probe failed ({issue.reason}): planned as if this host had no NVIDIA GPU; "
            "if it has one, fix the driver (`nvidia-smi` must work) or plan with --hardware"
        )
    return out


def _other_probes(snapshot: HardwareSnapshot) -> list[str]:
    out = []
    for issue in snapshot.issues:
        if issue.probe == "amd" and snapshot.amd is None and "not found" not in issue.reason.lower():
            out.append(f"the AMD probe failed ({issue.reason}): planned as if this host had no AMD GPU")
        elif issue.probe == "cpu":
            out.append(f"the CPU probe failed ({issue.reason}): core count unknown")
        elif issue.probe == "apple":
            out.append(f"the Apple silicon probe failed ({issue.reason}): unified memory and GPU unknown")
    return out


def _memory(snapshot: HardwareSnapshot) -> list[str]:
    mem = snapshot.memory
    if mem.total_bytes is not None or mem.available_bytes is not None:
        return []
    reason = next((i.reason for i in snapshot.issues if i.probe == "memory"), "not reported")
    return [f"system RAM size unknown (memory probe: {reason}): assumed the model fits in RAM, not checked"]


def _gpus(snapshot: HardwareSnapshot) -> list[str]:
    out = []
    for g in host_gpus(snapshot):
        if g.memory_source == "datasheet":
            out.append(
                f"GPU {g.index} ({g.name}) reported no memory size: assumed the datasheet's "
                f"{g.figures.memory_gb:g} GB"
            )
        elif g.memory_source == "unknown":
            out.append(
                f"GPU {g.index} ({g.name}) reported no memory size and is not in the hardware table: "
                "assumed the model fits, not checked"
            )
        elif g.memory_source.startswith("system RAM"):
            out.append(f"GPU {g.index} ({g.name}) shares system memory: sized against RAM ({g.memory_source})")
    names = dict.fromkeys(g.name for g in host_gpus(snapshot) if g.figures.memory_bandwidth_gbps is None)
    if snapshot.apple and snapshot.apple.figures.memory_bandwidth_gbps is None:
        names[snapshot.apple.chip] = None
    for name in names:
        near = near_match(name, gpu_cores=snapshot.apple.gpu_cores if snapshot.apple else None)
        hint = f" (it is a variant of the table's {near!r}, whose figures differ)" if near else ""
        out.append(
            f"{name!r} is not in gateway/data/hardware.yaml{hint}: no bandwidth figure, "
            "so decode speed is not estimated"
        )
    if snapshot.apple and snapshot.apple.unified_memory_bytes is None:
        out.append(f"{snapshot.apple.chip}: unified memory size not reported: sized against system RAM")
    return out


def host_unknowns(snapshot: HardwareSnapshot) -> list[str]:
    return _nvidia_probe(snapshot) + _other_probes(snapshot) + _memory(snapshot) + _gpus(snapshot)


def model_unknowns(spec: ModelSpec) -> list[str]:
    return [f"model: {note}" for note in spec.notes]


def unused_accelerators(snapshot: HardwareSnapshot) -> list[str]:
    """Devices on the PCI bus that no probe reported (another vendor's card, a GPU whose driver stack is
    missing): present, and unused by this plan."""
    probed = {"10de": snapshot.nvidia_gpu_count, "1002": len(snapshot.amd.gpus) if snapshot.amd else 0}
    seen: dict[str, int] = {}
    out = []
    for d in snapshot.pci_devices:
        seen[d.vendor_id] = seen.get(d.vendor_id, 0) + 1
        if seen[d.vendor_id] <= probed.get(d.vendor_id, 0):
            continue
        why = {"10de": "NVML did not report it (driver or nvidia-ml-py missing?)",
               "1002": "neither amdsmi nor rocm-smi reported it (ROCm missing?)"}.get(
            d.vendor_id, "enginegate has no probe or engine for it")
        out.append(f"accelerator present and unused: {d.vendor} {d.name} at {d.address} ({why}); "
                   "this plan runs without it")
    return out
