"""Datasheet bandwidth, FLOPs and capacity by device name, from gateway/data/hardware.yaml.

A table entry matches a device name when it appears there as whole words. When the words
after it name a variant of that part ("RTX 3090 Ti" for "RTX 3090", "Apple M3 Max" for
"Apple M3", "H200 NVL" for "H200"), the variant's figures differ: the entry is only a near
match, which gives no figures (`near_match` names it so the planner can warn).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from gateway.hardware.models import DeviceFigures

DEFAULT_TABLE = Path(__file__).resolve().parents[1] / "data" / "hardware.yaml"
VARIANT_WORDS = frozenset(
    {"ti", "super", "d", "laptop", "mobile", "max-q", "maxq", "nvl", "pcie", "sxm", "pro", "max", "ultra",
     "xt", "xtx", "x", "se", "lite", "gre", "nano", "nx", "agx", "oem"}
)


@dataclass(frozen=True)
class Entry:
    match: str
    gpu_cores: int | None
    figures: DeviceFigures


@lru_cache(maxsize=8)
def load_table(path: Path = DEFAULT_TABLE) -> tuple[tuple[str, DeviceFigures], ...]:
    return tuple((e.match, e.figures) for e in _entries(path))


@lru_cache(maxsize=8)
def _entries(path: Path) -> tuple[Entry, ...]:
    data = yaml.safe_load(path.read_text())
    rows = []
    for raw in data["devices"]:
        entry = dict(raw)
        match = str(entry.pop("match")).lower()
        cores = entry.pop("gpu_cores", None)
        rows.append(Entry(match, None if cores is None else int(cores), DeviceFigures.model_validate(entry)))
    return tuple(rows)


def _hits(name: str, gpu_cores: int | None, path: Path) -> tuple[list[Entry], list[Entry]]:
    """(entries matching `name` exactly as a part, entries that name a different variant of it)."""
    lowered = name.lower()
    exact: list[Entry] = []
    near: list[Entry] = []
    for e in _entries(path):
        if e.gpu_cores is not None and e.gpu_cores != gpu_cores:
            continue
        m = re.search(rf"(?<![a-z0-9]){re.escape(e.match)}(?![a-z0-9])", lowered)
        if m is None:
            continue
        following = re.split(r"[\s_/()]+", lowered[m.end() :].strip(" -_"))
        (near if following and following[0] in VARIANT_WORDS else exact).append(e)
    return exact, near


def _best(entries: list[Entry]) -> Entry:
    return max(entries, key=lambda e: (len(e.match), e.gpu_cores is not None))


def figures_for(name: str, path: Path = DEFAULT_TABLE, gpu_cores: int | None = None) -> DeviceFigures:
    exact, _ = _hits(name, gpu_cores, path)
    return _best(exact).figures if exact else DeviceFigures()


def near_match(name: str, path: Path = DEFAULT_TABLE, gpu_cores: int | None = None) -> str | None:
    """The table entry `name` resembles but is not (a variant), when no entry matches it exactly."""
    exact, near = _hits(name, gpu_cores, path)
    return None if exact or not near else _best(near).match
