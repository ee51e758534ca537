"""The frozen HardwareSnapshot and the one-line summary the server prints at start-up."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from gateway.hardware.models import AmdInfo, AppleInfo, CpuInfo, MemoryInfo, NvidiaInfo, PciDevice, ProbeIssue


class HardwareSnapshot(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    os: str
    cpu: CpuInfo
    memory: MemoryInfo = MemoryInfo()
    nvidia: NvidiaInfo | None = None
    apple: AppleInfo | None = None
    amd: AmdInfo | None = None
    pci_devices: tuple[PciDevice, ...] = ()
    """Display and accelerator devices on the PCI bus, every vendor (the planner names those it does not use)."""
    issues: tuple[ProbeIssue, ...] = ()

    @property
    def accelerators(self) -> tuple[str, ...]:
        names: list[str] = []
        if self.nvidia:
            names += [g.name for g in self.nvidia.gpus]
        if self.amd:
            names += [g.name for g in self.amd.gpus]
        if self.apple:
            names.append(f"{self.apple.chip} GPU")
        return tuple(names)

    @property
    def nvidia_gpu_count(self) -> int:
        return len(self.nvidia.gpus) if self.nvidia else 0

    def summary(self) -> str:
        gib = f"{self.memory.total_bytes / 2**30:.1f} GiB RAM" if self.memory.total_bytes else "RAM unknown"
        cores = f"{self.cpu.logical_cores} threads" if self.cpu.logical_cores else "cores unknown"
        parts = [f"{self.os} {self.cpu.architecture}", f"{self.cpu.model or 'unknown CPU'} ({cores})", gib]
        if self.nvidia and self.nvidia.gpus:
            counts: dict[str, int] = {}
            for g in self.nvidia.gpus:
                counts[g.name] = counts.get(g.name, 0) + 1
            gpus = ", ".join(f"{n}x {name}" for name, n in counts.items())
            nvlink = " with NVLink" if any(g.nvlink_peers for g in self.nvidia.gpus) else ""
            parts.append(f"{gpus}{nvlink} (driver {self.nvidia.driver_version}, CUDA {self.nvidia.cuda_version})")
        if self.amd and self.amd.gpus:
            parts.append(", ".join(g.name for g in self.amd.gpus))
        if self.apple:
            parts.append(f"{self.apple.chip}, {self.apple.gpu_cores or '?'} GPU cores, unified memory")
        if not self.accelerators:
            parts.append("no accelerator")
        return ", ".join(parts)
