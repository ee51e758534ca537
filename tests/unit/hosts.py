"""Recorded hosts and model fixtures shared by the hardware and planning tests."""

from __future__ import annotations

from functools import cache, lru_cache
from pathlib import Path

import gguf

from gateway.hardware import HardwareSnapshot, RecordedSources, detect
from gateway.modelsource import embedded_model_path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
HOSTS = FIXTURES / "hosts"
MODELS = FIXTURES / "models"


@cache
def host(name: str) -> HardwareSnapshot:
    return detect(RecordedSources(HOSTS / name))


def embedded_gguf() -> Path:
    return embedded_model_path()


@lru_cache(maxsize=1)
def embedded_reader() -> gguf.GGUFReader:
    """gguf's own reader on the embedded model (slow: seconds), shared by the tests that compare with it."""
    return gguf.GGUFReader(embedded_gguf())
