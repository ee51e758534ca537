"""`detect()`: run every probe in isolation and assemble one frozen snapshot.

A probe that raises or outlives its timeout leaves its part null and adds a ProbeIssue;
it never breaks the others. Each probe runs in a daemon thread so a hung driver call
cannot hold the process at exit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from gateway.hardware.amd import probe_amd
from gateway.hardware.apple import probe_apple
from gateway.hardware.cpu import probe_cpu
from gateway.hardware.memory import probe_memory
from gateway.hardware.models import CpuInfo, MemoryInfo, NvidiaInfo, ProbeIssue
from gateway.hardware.nvidia import parse_nvml
from gateway.hardware.snapshot import HardwareSnapshot
from gateway.hardware.sources import LiveSources, ProbeUnavailable, Sources

PROBE_TIMEOUT_S = 30.0


def _probe_nvidia(sources: Sources) -> NvidiaInfo | None:
    info = parse_nvml(sources.nvml_record())
    return info if info.gpus else None


def _run(name: str, probe: Callable[[], Any], timeout: float) -> tuple[Any, ProbeIssue | None]:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = probe()
        except ProbeUnavailable as exc:
            box["issue"] = str(exc)
        except Exception as exc:  # a probe's failure must never break detection
            box["issue"] = f"{type(exc).__name__}: {exc}"

    thread = threading.Thread(target=target, name=f"probe-{name}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return None, ProbeIssue(probe=name, reason=f"timed out after {timeout:g} s")
    if "issue" in box:
        return None, ProbeIssue(probe=name, reason=box["issue"])
    return box.get("value"), None


def detect(sources: Sources | None = None, timeout: float = PROBE_TIMEOUT_S) -> HardwareSnapshot:
    src = sources or LiveSources()
    probes: dict[str, Callable[[], Any]] = {
        "cpu": lambda: probe_cpu(src),
        "memory": lambda: probe_memory(src),
        "nvidia": lambda: _probe_nvidia(src),
        "apple": lambda: probe_apple(src),
        "amd": lambda: probe_amd(src),
    }
    results: dict[str, Any] = {}
    issues: list[ProbeIssue] = []
    for name, probe in probes.items():
        value, issue = _run(name, probe, timeout)
        results[name] = value
        if issue is not None:
            issues.append(issue)
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
        issues=tuple(issues),
    )
