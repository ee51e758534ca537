"""A short single-thread memory copy benchmark (run by `enginegate doctor`, not at start-up)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np


def measure_memory_bandwidth(size_bytes: int = 256 * 2**20, repeats: int = 5) -> float:
    """Best-of-`repeats` copy bandwidth in GB/s, counting bytes read plus bytes written."""
    if size_bytes < 2**20 or repeats < 1:
        raise ValueError("size_bytes must be at least 1 MiB and repeats at least 1")
    src = np.ones(size_bytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in before timing
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.nbytes / best / 1e9


def measurement_file() -> Path:
    base = os.environ.get("ENGINEGATE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "enginegate"
    )
    return Path(base) / "memory_bandwidth.json"


def save_measurement(gbps: float, cpu_model: str | None, path: Path | None = None) -> Path:
    target = path or measurement_file()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"cpu_model": cpu_model, "copy_gbps": gbps}))
    return target


def load_measurement(cpu_model: str | None, path: Path | None = None) -> float | None:
    """The stored measurement, if it was taken on a CPU of this model; else None."""
    try:
        data = json.loads((path or measurement_file()).read_text())
    except (OSError, ValueError):
        return None
    if data.get("cpu_model") != cpu_model:
        return None
    value = data.get("copy_gbps")
    return float(value) if isinstance(value, int | float) and value > 0 else None
