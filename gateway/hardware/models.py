"""The snapshot's data: frozen pydantic models, JSON-serialisable both ways."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ProbeIssue(_Frozen):
    """A probe that found nothing, failed or timed out; its fields stay null."""

    probe: str
    reason: str


class CpuInfo(_Frozen):
    model: str | None = None
    architecture: str
    logical_cores: int | None = None
    physical_cores: int | None = None
    instruction_sets: tuple[str, ...] = ()
    """Only the sets that engines care about: avx2, avx512f, avx512_vnni, avx512_bf16, amx, neon, sve..."""
    measured_bandwidth_gbps: float | None = None
    """Single-thread copy bandwidth from `enginegate doctor`; null unless measured."""


class MemoryInfo(_Frozen):
    total_bytes: int | None = None
    available_bytes: int | None = None


class DeviceFigures(_Frozen):
    """Datasheet figures from gateway/data/hardware.yaml; null for devices not in the table."""

    memory_bandwidth_gbps: float | None = None
    peak_dense_tflops: float | None = None
    """16-bit dense tensor throughput (no sparsity)."""
    memory_gb: float | None = None
    """Datasheet capacity (1e9 bytes); the planner uses it only when the driver reports no memory size."""
    source: str | None = None


class NvidiaGpu(_Frozen):
    index: int
    name: str
    uuid: str | None = None
    pci_bus_id: str | None = None
    memory_total_bytes: int | None = None
    memory_free_bytes: int | None = None
    compute_capability: tuple[int, int] | None = None
    pcie_generation: int | None = None
    pcie_width: int | None = None
    nvlink_active_links: int = 0
    nvlink_peers: tuple[int, ...] = ()
    """Indexes of GPUs reachable over NVLink (directly or through NVSwitch)."""
    nvswitch: bool = False
    mig_enabled: bool | None = None
    figures: DeviceFigures = Field(default_factory=DeviceFigures)


class NvidiaInfo(_Frozen):
    driver_version: str | None = None
    cuda_version: str | None = None
    gpus: tuple[NvidiaGpu, ...] = ()


class AppleInfo(_Frozen):
    chip: str
    unified_memory_bytes: int | None = None
    gpu_cores: int | None = None
    figures: DeviceFigures = Field(default_factory=DeviceFigures)


class AmdGpu(_Frozen):
    index: int
    name: str
    memory_total_bytes: int | None = None
    link_type: str | None = None
    """How this GPU reaches its peers: "XGMI" or "PCIE"; null when not reported."""
    figures: DeviceFigures = Field(default_factory=DeviceFigures)


class AmdInfo(_Frozen):
    source: str
    gpus: tuple[AmdGpu, ...] = ()


class PciDevice(_Frozen):
    """A display or accelerator device on the PCI bus, whichever vendor made it."""

    address: str
    vendor_id: str
    """Four hex digits: 10de NVIDIA, 1002 AMD, 8086 Intel..."""
    device_id: str = ""
    vendor: str
    name: str
    source: str
    """lspci or drm (/sys/class/drm)."""
