"""An NVML emulator with nvidia-ml-py's names and return shapes: one GPU whose figures move.

The Prometheus integration test puts this directory first on the gateway's PYTHONPATH so the
hardware dashboard's GPU queries have data on a machine without a GPU. Nothing else uses it.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

TOTAL = 141 * 2**30


class NVMLError(Exception):
    pass


def nvmlInit() -> None: ...


def nvmlShutdown() -> None: ...


def nvmlDeviceGetCount() -> int:
    return 1


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    return index


def nvmlDeviceGetName(handle: int) -> str:
    return "Emulated H200"


def _phase() -> float:
    return (time.time() % 60) / 60


def nvmlDeviceGetMemoryInfo(handle: int) -> SimpleNamespace:
    used = int(TOTAL * (0.4 + 0.2 * _phase()))
    return SimpleNamespace(total=TOTAL, used=used, free=TOTAL - used)


def nvmlDeviceGetUtilizationRates(handle: int) -> SimpleNamespace:
    return SimpleNamespace(gpu=int(100 * _phase()), memory=30)


def nvmlDeviceGetPowerUsage(handle: int) -> int:
    return int(200_000 + 400_000 * _phase())
