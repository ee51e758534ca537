"""NVML -> enginegate_gpu_* mapping. No GPU on the build machine: NVML is a fake handle object
with nvidia-ml-py's function names and return shapes (memory in bytes, utilisation in %,
power in milliwatts). Discovery against the real pynvml must find nothing here and register nothing."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.gpu import NvmlCollector
from gateway.metrics import GatewayMetrics


class NVMLError(Exception):
    pass


class FakeNvml:
    def __init__(self, boards: list[dict[str, Any]], fail_init: bool = False) -> None:
        self.boards = boards
        self.fail_init = fail_init

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise NVMLError("NVML Shared Library Not Found")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.boards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict[str, Any]:
        return self.boards[index]

    def nvmlDeviceGetName(self, handle: dict[str, Any]) -> bytes:
        return handle["name"]

    def nvmlDeviceGetMemoryInfo(self, handle: dict[str, Any]) -> SimpleNamespace:
        return SimpleNamespace(used=handle["used"], total=handle["total"], free=handle["total"] - handle["used"])

    def nvmlDeviceGetUtilizationRates(self, handle: dict[str, Any]) -> SimpleNamespace:
        return SimpleNamespace(gpu=handle["util"], memory=10)

    def nvmlDeviceGetPowerUsage(self, handle: dict[str, Any]) -> int:
        if handle.get("power_mw") is None:
            raise NVMLError("Not Supported")
        return int(handle["power_mw"])


def scrape(collector: NvmlCollector) -> dict[tuple[str, str], float]:
    registry = CollectorRegistry()
    registry.register(collector)
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out[(s.name, s.labels["gpu"])] = s.value
            assert set(s.labels) == {"gpu", "name"}
    return out


def test_maps_memory_utilisation_and_power() -> None:
    nvml = FakeNvml([
        {"name": b"NVIDIA H200", "used": 40 * 2**30, "total": 141 * 2**30, "util": 87, "power_mw": 512_250},
        {"name": "NVIDIA L40S", "used": 0, "total": 48 * 2**30, "util": 0, "power_mw": None},
    ])
    collector = NvmlCollector.discover(nvml)
    assert collector is not None
    got = scrape(collector)
    assert got[("enginegate_gpu_memory_used_bytes", "0")] == 40 * 2**30
    assert got[("enginegate_gpu_memory_total_bytes", "0")] == 141 * 2**30
    assert got[("enginegate_gpu_utilization_ratio", "0")] == pytest.approx(0.87)
    assert got[("enginegate_gpu_power_watts", "0")] == pytest.approx(512.25)
    assert got[("enginegate_gpu_utilization_ratio", "1")] == 0
    assert ("enginegate_gpu_power_watts", "1") not in got  # not supported on that board: left out, others kept


def test_no_gpu_or_no_library_registers_nothing() -> None:
    assert NvmlCollector.discover(FakeNvml([])) is None
    assert NvmlCollector.discover(FakeNvml([{"name": b"x"}], fail_init=True)) is None


def test_real_pynvml_on_this_host_matches_its_hardware() -> None:
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError:
        count = 0
    metrics = GatewayMetrics()
    assert (metrics.gpu is not None) == (count > 0)
    assert (b"enginegate_gpu_memory_used_bytes" in metrics.render()) == (count > 0)
