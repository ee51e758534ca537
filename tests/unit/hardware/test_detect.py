import threading
from pathlib import Path
from typing import Any

import pytest

from gateway.hardware import HardwareSnapshot, LiveSources, RecordedSources, detect
from gateway.hardware.figures import figures_for, load_table
from tests.unit.hosts import HOSTS, host

ALL_HOSTS = sorted(p.name for p in HOSTS.iterdir() if (p / "host.json").is_file())

# host -> (accelerator names, GPU count, has NVLink, an issue expected from the nvidia probe)
EXPECTED = {
    "hgx-8x-h100": ("NVIDIA H100 80GB HBM3", 8, True, False),
    "2x-rtx-4090": ("NVIDIA GeForce RTX 4090", 2, False, False),
    "rtx-3060": ("NVIDIA GeForce RTX 3060", 1, False, False),
    "rtx-2080-ti": ("NVIDIA GeForce RTX 2080 Ti", 1, False, False),
    "4x-a100-nvlink": ("NVIDIA A100-SXM4-80GB", 4, True, False),
    "4x-a100-pcie": ("NVIDIA A100 80GB PCIe", 4, False, False),
    "mac-studio-m3-ultra": ("Apple M3 Ultra GPU", 0, False, True),
    "macbook-air-m2": ("Apple M2 GPU", 0, False, True),
    "raspberry-pi-5": (None, 0, False, True),
    "no-nvml": (None, 0, False, True),
    "build-machine": (None, 0, False, True),
    "2x-mi300x": ("AMD Instinct MI300X OAM", 0, False, True),
    "intel-arc-a770": (None, 0, False, True),  # a GPU on the PCI bus that no probe covers (see test_pci.py)
}


def test_every_recorded_host_has_an_expectation() -> None:
    assert set(ALL_HOSTS) == set(EXPECTED)


@pytest.mark.parametrize("name", ALL_HOSTS)
def test_recorded_host(name: str) -> None:
    s = host(name)
    accel, gpus, nvlink, nvml_issue = EXPECTED[name]
    assert (s.accelerators[0] if s.accelerators else None) == accel
    assert s.nvidia_gpu_count == gpus
    assert any(g.nvlink_peers for g in (s.nvidia.gpus if s.nvidia else ())) == nvlink
    assert any(i.probe == "nvidia" for i in s.issues) == nvml_issue
    assert s.memory.total_bytes and s.cpu.logical_cores
    assert "\n" not in s.summary()
    assert HardwareSnapshot.model_validate_json(s.model_dump_json()) == s


def test_missing_nvml_leaves_nvidia_null_with_the_reason() -> None:
    s = host("no-nvml")
    assert s.nvidia is None
    assert [i.reason for i in s.issues if i.probe == "nvidia"] == ["NVML: NVML Shared Library Not Found"]
    assert s.cpu.model == "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz"


def test_live_detection_of_this_machine() -> None:
    s = detect()
    assert s.cpu.logical_cores and s.memory.total_bytes
    assert HardwareSnapshot.model_validate_json(s.model_dump_json()) == s
    if s.nvidia is None:
        assert any(i.probe == "nvidia" for i in s.issues)


class _Broken(RecordedSources):
    """A recorded host whose NVML call raises an unexpected error and whose memory probe hangs."""

    def __init__(self, directory: Path, release: threading.Event) -> None:
        super().__init__(directory)
        self.release = release

    def nvml_record(self) -> dict[str, Any]:
        raise RuntimeError("driver exploded")

    def read_text(self, path: str) -> str | None:
        if path == "/proc/meminfo":
            self.release.wait()
        return super().read_text(path)


def test_a_failing_or_hanging_probe_never_breaks_the_others() -> None:
    release = threading.Event()
    try:
        s = detect(_Broken(HOSTS / "hgx-8x-h100", release), timeout=0.5)
    finally:
        release.set()
    reasons = {i.probe: i.reason for i in s.issues}
    assert reasons["nvidia"] == "RuntimeError: driver exploded"
    assert reasons["memory"].startswith("timed out")
    assert s.nvidia is None and s.memory.total_bytes is None
    assert s.cpu.model == "Intel(R) Xeon(R) Platinum 8480+"  # the CPU probe still ran


def test_figures_table_longest_match_wins() -> None:
    assert figures_for("NVIDIA H100 80GB HBM3").memory_bandwidth_gbps == 3350
    assert figures_for("NVIDIA H100 PCIe").memory_bandwidth_gbps == 2000
    assert figures_for("Apple M2 Max").memory_bandwidth_gbps == 400
    assert figures_for("Some Future Accelerator").memory_bandwidth_gbps is None
    assert all(f.memory_bandwidth_gbps is None or f.memory_bandwidth_gbps > 0 for _, f in load_table())


def test_live_sources_report_a_missing_tool_as_none() -> None:
    assert LiveSources().run(["enginegate-no-such-tool-xyz"], timeout=1) is None
