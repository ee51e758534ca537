"""Measured footprints: what a loaded engine really holds, to replace the planner's estimate.

- An engine server (llama-server, vLLM, ...) leads its own process group: the RSS of every
  process in that group, and on NVIDIA the GPU memory NVML reports for those processes.
- An in-process engine (llama.cpp, MLX): the gateway's own RSS after the load minus before
  (loads are serialized by the lifecycle, so the delta is that model's).
"""

from __future__ import annotations

import ctypes
import logging
import os

import psutil

log = logging.getLogger("enginegate.footprint")


def release_freed_memory() -> None:
    """Hand memory an unloaded in-process model freed back to the system (glibc's malloc_trim), so
    the next load's RSS growth is that model's and not hidden by reused heap; a no-op elsewhere."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def own_rss() -> int:
    return int(psutil.Process().memory_info().rss)


def group_pids(pgid: int) -> list[int]:
    pids: list[int] = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid:
                pids.append(proc.pid)
        except (ProcessLookupError, PermissionError, OSError):
            continue
    return pids


def group_rss(pgid: int) -> int | None:
    """Resident bytes of every process in the group `pgid`; None when the group is gone."""
    total = 0
    found = False
    for pid in group_pids(pgid):
        try:
            rss = psutil.Process(pid).memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if rss:  # a zombie (exited, not yet reaped) holds nothing
            total += rss
            found = True
    return total if found else None


def gpu_bytes(pids: list[int]) -> dict[int, int]:
    """GPU index -> bytes NVML reports for these processes; empty without NVML or GPUs."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return {}
    wanted = set(pids)
    used: dict[int, int] = {}
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver, no GPU
        return {}
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid in wanted and proc.usedGpuMemory:
                    used[index] = used.get(index, 0) + int(proc.usedGpuMemory)
    except Exception as exc:
        log.debug("NVML per-process memory unavailable: %s", exc)
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return used


def measure_group(pgid: int) -> dict[str, int]:
    """Pool -> bytes held by an engine server's process group (`ram`, and `gpu:N` where NVML sees it)."""
    measured: dict[str, int] = {}
    rss = group_rss(pgid)
    if rss is not None:
        measured["ram"] = rss
    for index, used in gpu_bytes(group_pids(pgid)).items():
        measured[f"gpu:{index}"] = used
    return measured
