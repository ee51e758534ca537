"""NVIDIA probe through NVML (nvidia-ml-py).

Two steps so recorded hosts can be replayed: `read_nvml()` asks NVML and returns a plain
record (what fixtures store); `parse_nvml(record)` turns a record into `NvidiaInfo`.
A value NVML refuses to give (not supported on this GPU) is recorded as null.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from gateway.hardware.figures import figures_for
from gateway.hardware.models import NvidiaGpu, NvidiaInfo
from gateway.hardware.sources import ProbeUnavailable

T = TypeVar("T")
NVLINK_MAX_LINKS = 18


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def init_nvml() -> Any:
    """The `pynvml` module with NVML initialised (the one place it is): ProbeUnavailable when there is none."""
    try:
        import pynvml
    except ImportError as exc:
        raise ProbeUnavailable("nvidia-ml-py is not installed") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise ProbeUnavailable(f"NVML: {exc}") from exc
    return pynvml


def read_nvml() -> dict[str, Any]:
    pynvml = init_nvml()

    def ask(call: Callable[..., T], *args: Any) -> T | None:
        try:
            return call(*args)
        except pynvml.NVMLError:
            return None

    try:
        driver = ask(pynvml.nvmlSystemGetDriverVersion)
        record: dict[str, Any] = {
            "driver_version": None if driver is None else _text(driver),
            "cuda_driver_version": ask(pynvml.nvmlSystemGetCudaDriverVersion),
            "gpus": [],
        }
        for index in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(index)
            mem = ask(pynvml.nvmlDeviceGetMemoryInfo, h)
            pci = ask(pynvml.nvmlDeviceGetPciInfo, h)
            links: list[str | None] = []
            for link in range(NVLINK_MAX_LINKS):
                state = ask(pynvml.nvmlDeviceGetNvLinkState, h, link)
                if state is None:
                    break
                if state == pynvml.NVML_FEATURE_ENABLED:
                    remote = ask(pynvml.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
                    links.append(None if remote is None else _text(remote.busId))
            mig = ask(pynvml.nvmlDeviceGetMigMode, h)
            uuid = ask(pynvml.nvmlDeviceGetUUID, h)
            cc = ask(pynvml.nvmlDeviceGetCudaComputeCapability, h)
            record["gpus"].append(
                {
                    "index": index,
                    "name": _text(pynvml.nvmlDeviceGetName(h)),
                    "uuid": None if uuid is None else _text(uuid),
                    "pci_bus_id": None if pci is None else _text(pci.busId),
                    "memory_total": None if mem is None else int(mem.total),
                    "memory_free": None if mem is None else int(mem.free),
                    "compute_capability": None if cc is None else list(cc),
                    "pcie_generation": ask(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
                    "pcie_width": ask(pynvml.nvmlDeviceGetCurrPcieLinkWidth, h),
                    "nvlink_remote_bus_ids": links,
                    "mig_mode": None if mig is None else int(mig[0]),
                }
            )
        return record
    finally:
        pynvml.nvmlShutdown()


def _cuda_text(version: int | None) -> str | None:
    return None if version is None else f"{version // 1000}.{(version % 1000) // 10}"


def _bus(bus_id: str) -> str:
    # NVML pads the domain to 8 hex digits in some calls and 4 in others.
    domain, _, rest = bus_id.lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else bus_id.lower()


def parse_nvml(record: dict[str, Any]) -> NvidiaInfo:
    gpus_raw: list[dict[str, Any]] = record.get("gpus", [])
    by_bus = {_bus(g["pci_bus_id"]): g["index"] for g in gpus_raw if g.get("pci_bus_id")}
    switched = [
        g["index"]
        for g in gpus_raw
        if any(b is not None and _bus(b) not in by_bus for b in g.get("nvlink_remote_bus_ids", []))
    ]
    gpus = []
    for g in gpus_raw:
        remotes = [_bus(b) for b in g.get("nvlink_remote_bus_ids", []) if b is not None]
        direct = {by_bus[b] for b in remotes if b in by_bus}
        nvswitch = g["index"] in switched
        peers = direct | ({i for i in switched if i != g["index"]} if nvswitch else set())
        cc = g.get("compute_capability")
        name = str(g["name"])
        mig = g.get("mig_mode")
        gpus.append(
            NvidiaGpu(
                index=int(g["index"]),
                name=name,
                uuid=g.get("uuid"),
                pci_bus_id=g.get("pci_bus_id"),
                memory_total_bytes=g.get("memory_total"),
                memory_free_bytes=g.get("memory_free"),
                compute_capability=None if cc is None else (int(cc[0]), int(cc[1])),
                pcie_generation=g.get("pcie_generation"),
                pcie_width=g.get("pcie_width"),
                nvlink_active_links=len(g.get("nvlink_remote_bus_ids", [])),
                nvlink_peers=tuple(sorted(peers - {g["index"]})),
                nvswitch=nvswitch,
                mig_enabled=None if mig is None else bool(mig),
                figures=figures_for(name),
            )
        )
    return NvidiaInfo(
        driver_version=record.get("driver_version"),
        cuda_version=_cuda_text(record.get("cuda_driver_version")),
        gpus=tuple(gpus),
    )
