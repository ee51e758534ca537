"""Datasheet bandwidth and FLOPs by device name, from gateway/data/hardware.yaml."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml

from gateway.hardware.models import DeviceFigures

DEFAULT_TABLE = Path(__file__).resolve().parents[1] / "data" / "hardware.yaml"


@lru_cache(maxsize=8)
def load_table(path: Path = DEFAULT_TABLE) -> tuple[tuple[str, DeviceFigures], ...]:
    data = yaml.safe_load(path.read_text())
    rows = []
    for entry in data["devices"]:
        match = str(entry.pop("match"))
        rows.append((match.lower(), DeviceFigures.model_validate(entry)))
    return tuple(rows)


def figures_for(name: str, path: Path = DEFAULT_TABLE) -> DeviceFigures:
    lowered = name.lower()
    hits = [(len(m), f) for m, f in load_table(path) if m in lowered]
    return max(hits, key=lambda h: h[0])[1] if hits else DeviceFigures()
