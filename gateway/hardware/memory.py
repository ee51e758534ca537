"""Memory probe: RAM total and available."""

from __future__ import annotations

import re

from gateway.hardware.models import MemoryInfo
from gateway.hardware.sources import ProbeUnavailable, Sources


def parse_proc_meminfo(text: str) -> MemoryInfo:
    kib: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"(\w+):\s+(\d+)\s*kB", line)
        if m:
            kib[m.group(1)] = int(m.group(2))
    if "MemTotal" not in kib:
        raise ValueError("/proc/meminfo has no MemTotal line")
    available = kib.get("MemAvailable")
    return MemoryInfo(
        total_bytes=kib["MemTotal"] * 1024,
        available_bytes=None if available is None else available * 1024,
    )


def parse_darwin(memsize: str, vm_stat: str | None) -> MemoryInfo:
    total = int(memsize.strip().split()[-1])
    available = None
    if vm_stat:
        page = re.search(r"page size of (\d+) bytes", vm_stat)
        pages = {
            k.strip(): int(v.strip().rstrip("."))
            for k, v in re.findall(r"^Pages ([\w ]+):\s+(\d+\.?)$", vm_stat, re.MULTILINE)
        }
        if page and {"free", "inactive"} <= pages.keys():
            free_pages = pages["free"] + pages["inactive"] + pages.get("speculative", 0)
            available = free_pages * int(page.group(1))
    return MemoryInfo(total_bytes=total, available_bytes=available)


def probe_memory(sources: Sources) -> MemoryInfo:
    if sources.system() == "Darwin":
        memsize = sources.run(["sysctl", "-n", "hw.memsize"], timeout=5)
        if memsize is None:
            raise ProbeUnavailable("sysctl not found")
        return parse_darwin(memsize, sources.run(["vm_stat"], timeout=5))
    text = sources.read_text("/proc/meminfo")
    if text is None:
        raise ProbeUnavailable("/proc/meminfo not readable")
    return parse_proc_meminfo(text)
