"""Apple Silicon probe: chip, unified memory and GPU cores (sysctl, system_profiler)."""

from __future__ import annotations

import json
from typing import Any

from gateway.hardware.figures import figures_for
from gateway.hardware.models import AppleInfo
from gateway.hardware.sources import ProbeUnavailable, Sources

SYSTEM_PROFILER = ["system_profiler", "SPHardwareDataType", "SPDisplaysDataType", "-json"]


def parse_system_profiler(text: str, memsize: int | None) -> AppleInfo:
    data: dict[str, Any] = json.loads(text)
    hardware = (data.get("SPHardwareDataType") or [{}])[0]
    displays = data.get("SPDisplaysDataType") or []
    chip = hardware.get("chip_type")
    if not chip:
        raise ValueError("system_profiler reports no chip_type: not Apple Silicon")
    cores = next((d.get("sppci_cores") for d in displays if d.get("sppci_cores")), None)
    if memsize is None and hardware.get("physical_memory"):
        amount, _, unit = str(hardware["physical_memory"]).partition(" ")
        memsize = int(float(amount) * {"GB": 2**30, "TB": 2**40}[unit])
    return AppleInfo(
        chip=str(chip),
        unified_memory_bytes=memsize,
        gpu_cores=int(cores) if cores is not None else None,
        figures=figures_for(str(chip), gpu_cores=int(cores) if cores is not None else None),
    )


def probe_apple(sources: Sources) -> AppleInfo | None:
    if sources.system() != "Darwin" or sources.machine() != "arm64":
        return None
    text = sources.run(SYSTEM_PROFILER, timeout=20)
    if text is None:
        raise ProbeUnavailable("system_profiler not found")
    memsize = sources.run(["sysctl", "-n", "hw.memsize"], timeout=5)
    return parse_system_profiler(text, int(memsize.strip()) if memsize else None)
