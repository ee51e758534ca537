"""`EngineStats` counted by an in-process engine: bumped from its worker thread, read from the event loop."""

from __future__ import annotations

import dataclasses
import threading

from adapters.base import EngineStats


def _add(value: float | None, delta: float) -> float | None:
    return value if not delta else (value or 0) + delta


class StatsCounter:
    def __init__(self, initial: EngineStats) -> None:
        self._stats = initial
        self._lock = threading.Lock()

    def bump(
        self,
        *,
        requests_running: int = 0,
        requests_waiting: int = 0,
        prompt_tokens_total: int = 0,
        generation_tokens_total: int = 0,
        ttft_seconds_sum: float = 0.0,
        ttft_seconds_count: int = 0,
    ) -> None:
        with self._lock:
            s = self._stats
            s.requests_running = _add(s.requests_running, requests_running)
            s.requests_waiting = _add(s.requests_waiting, requests_waiting)
            s.prompt_tokens_total = _add(s.prompt_tokens_total, prompt_tokens_total)
            s.generation_tokens_total = _add(s.generation_tokens_total, generation_tokens_total)
            s.ttft_seconds_sum = _add(s.ttft_seconds_sum, ttft_seconds_sum)
            s.ttft_seconds_count = _add(s.ttft_seconds_count, ttft_seconds_count)

    def snapshot(self) -> EngineStats:
        with self._lock:
            return dataclasses.replace(self._stats)
