"""A short single-thread memory copy benchmark (run by `enginegate doctor`, not at start-up)."""

from __future__ import annotations

import time

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
