"""Host detection: `detect()` returns a frozen HardwareSnapshot, probed once."""

from gateway.hardware.bandwidth import load_measurement, measure_memory_bandwidth, measurement_file, save_measurement
from gateway.hardware.detect import detect
from gateway.hardware.figures import figures_for
from gateway.hardware.models import (
    AmdGpu,
    AmdInfo,
    AppleInfo,
    CpuInfo,
    DeviceFigures,
    MemoryInfo,
    NvidiaGpu,
    NvidiaInfo,
    ProbeIssue,
)
from gateway.hardware.snapshot import HardwareSnapshot
from gateway.hardware.sources import LiveSources, ProbeUnavailable, RecordedSources, Sources

__all__ = [
    "AmdGpu",
    "AmdInfo",
    "AppleInfo",
    "CpuInfo",
    "DeviceFigures",
    "HardwareSnapshot",
    "LiveSources",
    "MemoryInfo",
    "NvidiaGpu",
    "NvidiaInfo",
    "ProbeIssue",
    "ProbeUnavailable",
    "RecordedSources",
    "Sources",
    "detect",
    "figures_for",
    "load_measurement",
    "measure_memory_bandwidth",
    "measurement_file",
    "save_measurement",
]
