"""Host detection: `detect()` returns a frozen HardwareSnapshot, probed once.

Minimal foundation version (OS, CPU, RAM); the detection issue completes it.
"""

from __future__ import annotations

import os
import platform

import psutil
from pydantic import BaseModel, ConfigDict


class CpuInfo(BaseModel):
    model_config = ConfigDict(frozen=True)
    model: str | None
    architecture: str
    logical_cores: int | None
    physical_cores: int | None


class MemoryInfo(BaseModel):
    model_config = ConfigDict(frozen=True)
    total_bytes: int | None
    available_bytes: int | None


class HardwareSnapshot(BaseModel):
    model_config = ConfigDict(frozen=True)
    os: str
    cpu: CpuInfo
    memory: MemoryInfo
    accelerators: tuple[str, ...] = ()

    def summary(self) -> str:
        gib = (self.memory.total_bytes or 0) / 2**30
        acc = ", ".join(self.accelerators) or "no accelerator"
        return f"{self.os} {self.cpu.architecture}, {self.cpu.model or 'unknown CPU'} ({self.cpu.logical_cores} threads), {gib:.1f} GiB RAM, {acc}"


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def detect() -> HardwareSnapshot:
    vm = psutil.virtual_memory()
    return HardwareSnapshot(
        os=platform.system(),
        cpu=CpuInfo(
            model=_cpu_model(),
            architecture=platform.machine(),
            logical_cores=os.cpu_count(),
            physical_cores=psutil.cpu_count(logical=False),
        ),
        memory=MemoryInfo(total_bytes=vm.total, available_bytes=vm.available),
    )


__all__ = ["CpuInfo", "HardwareSnapshot", "MemoryInfo", "detect"]
