"""`detect()`: run every probe in isolation and assemble one frozen snapshot.

A probe that raises or outlives the timeout leaves its part null and adds a ProbeIssue;
it never breaks the others. The probes run at once, each in a daemon thread, so a hung
driver call neither delays the others nor holds the process at exit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from gateway.hardware.amd import probe_amd
from gateway.hardware.apple import probe_apple
from gateway.hardware.cpu import probe_cpu
from gateway.hardware.memory import probe_memory
from gateway.hardware.models import CpuInfo, MemoryInfo, NvidiaInfo, ProbeIssue
from gateway.hardware.nvidia import parse_nvml
from gateway.hardware.pci import probe_pci
from gateway.hardware.snapshot import HardwareSnapshot
from gateway.hardware.sources import LiveSources, ProbeUnavailable, Sources

PROBE_TIMEOUT_S = 30.0


def _probe_nvidia(sources: Sources) -> NvidiaInfo | None:
    info = parse_nvml(sources.nvml_record())
    return info if info.gpus else None


class _Probe(threading.Thread):
    def __init__(self, name: str, probe: Callable[[], Any]) -> None:
        super().__init__(name=f"probe-{name}", daemon=True)
        self.probe_name = name
        self.probe = probe
        self.value: Any = None
        self.issue: str | None = None

    def run(self) -> None:
        try:
            self.value = self.probe()
        except ProbeUnavailable as exc:
            self.issue = str(exc)
        except Exception as exc:  # a probe's failure must never break detection
            self.issue = f"{type(exc).__name__}: {exc}"


def detect(sources: Sources | None = None, timeout: float = PROBE_TIMEOUT_S) -> HardwareSnapshot:
    src = sources or LiveSources()
    probes: dict[str, Callable[[], Any]] = {
        "cpu": lambda: probe_cpu(src),
        "memory": lambda: probe_memory(src),
        "nvidia": lambda: _probe_nvidia(src),
        "apple": lambda: probe_apple(src),
        "amd": lambda: probe_amd(src),
        "pci": lambda: probe_pci(src),
    }
    threads = [_Probe(name, probe) for name, probe in probes.items()]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    results: dict[str, Any] = {}
    issues: list[ProbeIssue] = []
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            issues.append(ProbeIssue(probe=t.probe_name, reason=f"timed out after {timeout:g} s"))
            results[t.probe_name] = None
            continue
        results[t.probe_name] = t.value
        if t.issue is not None:
            issues.append(ProbeIssue(probe=t.probe_name, reason=t.issue))
    cpu = results["cpu"] or CpuInfo(architecture=src.machine())
    measured = src.measured_bandwidth(cpu.model)
    if measured is not None:
        cpu = cpu.model_copy(update={"measured_bandwidth_gbps": measured})
    return HardwareSnapshot(
        os=src.system(),
        cpu=cpu,
        memory=results["memory"] or MemoryInfo(),
        nvidia=results["nvidia"],
        apple=results["apple"],
        amd=results["amd"],
        pci_devices=results["pci"] or (),
        issues=tuple(issues),
    )
