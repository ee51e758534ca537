"""Where probes read from: the live host, or a directory of recorded tool output.

Probes never touch the OS directly; they ask a `Sources`. `LiveSources` reads files, runs
tools and calls NVML; `RecordedSources` replays what those returned on another machine, so
every probe is tested on hosts we do not have.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any, Protocol

import psutil


class ProbeUnavailable(Exception):
    """The source this probe needs is absent on this host (a tool, a library, a file)."""


class Sources(Protocol):
    def system(self) -> str: ...
    def machine(self) -> str: ...
    def read_text(self, path: str) -> str | None: ...
    def run(self, argv: list[str], timeout: float) -> str | None: ...
    def cpu_counts(self) -> tuple[int | None, int | None]: ...
    def nvml_record(self) -> dict[str, Any]: ...
    def amdsmi_record(self) -> dict[str, Any]: ...
    def measured_bandwidth(self, cpu_model: str | None) -> float | None: ...


class LiveSources:
    def system(self) -> str:
        return platform.system()

    def machine(self) -> str:
        return platform.machine()

    def read_text(self, path: str) -> str | None:
        try:
            return Path(path).read_text(errors="replace")
        except OSError:
            return None

    def run(self, argv: list[str], timeout: float) -> str | None:
        if shutil.which(argv[0]) is None:
            return None
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=True)
        return done.stdout

    def cpu_counts(self) -> tuple[int | None, int | None]:
        return os.cpu_count(), psutil.cpu_count(logical=False)

    def nvml_record(self) -> dict[str, Any]:
        from gateway.hardware.nvidia import read_nvml

        return read_nvml()

    def amdsmi_record(self) -> dict[str, Any]:
        from gateway.hardware.amd import read_amdsmi

        return read_amdsmi()

    def measured_bandwidth(self, cpu_model: str | None) -> float | None:
        from gateway.hardware.bandwidth import load_measurement

        return load_measurement(cpu_model)


class RecordedSources:
    """Replays `host.json` in a fixture directory.

    host.json: {"system", "machine", "logical_cores", "physical_cores",
    "files": {path: file}, "commands": {"argv joined by spaces": file},
    "nvml": file | null, "nvml_error": str, "amdsmi": file | null}
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.host: dict[str, Any] = json.loads((directory / "host.json").read_text())

    def system(self) -> str:
        return str(self.host["system"])

    def machine(self) -> str:
        return str(self.host["machine"])

    def _file(self, name: str) -> str:
        return (self.directory / name).read_text()

    def read_text(self, path: str) -> str | None:
        name = self.host.get("files", {}).get(path)
        return None if name is None else self._file(name)

    def run(self, argv: list[str], timeout: float) -> str | None:
        name = self.host.get("commands", {}).get(" ".join(argv))
        return None if name is None else self._file(name)

    def cpu_counts(self) -> tuple[int | None, int | None]:
        return self.host.get("logical_cores"), self.host.get("physical_cores")

    def nvml_record(self) -> dict[str, Any]:
        name = self.host.get("nvml")
        if name is None:
            raise ProbeUnavailable(self.host.get("nvml_error", "NVML Shared Library Not Found"))
        record: dict[str, Any] = json.loads(self._file(name))
        return record

    def amdsmi_record(self) -> dict[str, Any]:
        name = self.host.get("amdsmi")
        if name is None:
            raise ProbeUnavailable("amdsmi is not importable")
        record: dict[str, Any] = json.loads(self._file(name))
        return record

    def measured_bandwidth(self, cpu_model: str | None) -> float | None:
        value = self.host.get("measured_bandwidth_gbps")
        return None if value is None else float(value)
