"""NVIDIA GPU figures from NVML (package nvidia-ml-py, module `pynvml`), read at scrape time.

Registered only when NVML initialises and finds at least one GPU. Each figure is read on its
own, so a GPU that does not report one (power on some boards) still reports the others.
Labels: `gpu` (the NVML index) and `name` (the board name): bounded by the GPUs in the host.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.hardware.nvidia import init_nvml

log = logging.getLogger("enginegate.gpu")

LABELS = ["gpu", "name"]


class NvmlCollector(Collector):
    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.devices: list[tuple[str, str, Any]] = []
        for index in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            name = nvml.nvmlDeviceGetName(handle)
            self.devices.append((str(index), name.decode() if isinstance(name, bytes) else str(name), handle))

    @classmethod
    def discover(cls, nvml: Any = None) -> NvmlCollector | None:
        """A collector when NVML finds a GPU, else None (no driver, no library, no GPU)."""
        try:
            if nvml is None:
                nvml = init_nvml()
            else:
                nvml.nvmlInit()
            collector = cls(nvml)
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
            log.debug("no NVML GPU metrics: %s", exc)
            return None
        if not collector.devices:
            return None
        return collector

    def collect(self) -> Iterator[Metric]:
        used = GaugeMetricFamily("enginegate_gpu_memory_used_bytes", "GPU memory in use (NVML).", labels=LABELS)
        total = GaugeMetricFamily("enginegate_gpu_memory_total_bytes", "GPU memory on the board (NVML).", labels=LABELS)
        util = GaugeMetricFamily(
            "enginegate_gpu_utilization_ratio", "Fraction of the last sample period the GPU was busy, 0..1 (NVML).", labels=LABELS
        )
        power = GaugeMetricFamily("enginegate_gpu_power_watts", "GPU power draw in watts (NVML).", labels=LABELS)
        n = self.nvml
        for index, name, handle in self.devices:
            labels = [index, name]
            memory = _read(lambda: n.nvmlDeviceGetMemoryInfo(handle))
            if memory is not None:
                used.add_metric(labels, float(memory.used))
                total.add_metric(labels, float(memory.total))
            rates = _read(lambda: n.nvmlDeviceGetUtilizationRates(handle))
            if rates is not None:
                util.add_metric(labels, float(rates.gpu) / 100.0)
            milliwatts = _read(lambda: n.nvmlDeviceGetPowerUsage(handle))
            if milliwatts is not None:
                power.add_metric(labels, float(milliwatts) / 1000.0)
        yield from (used, total, util, power)


def _read(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception:  # NVMLError_NotSupported and friends: leave the figure out
        return None
