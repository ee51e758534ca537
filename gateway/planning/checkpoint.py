"""The weight bytes a Hugging Face checkpoint states about itself, before any arithmetic.

In order: the index's `metadata.total_size` (`model.safetensors.index.json`, or the PyTorch
`pytorch_model.bin.index.json`), which is there even when the shards are not downloaded yet; else
the safetensors headers (8-byte little-endian length, then that much JSON: each tensor's
`data_offsets`; only the header is read); else the sizes of the weight files. The config arithmetic
(gateway/planning/stack) is the fallback and the cross-check: `disagreement()` names both figures
when they differ by more than `TOLERANCE`.

The header reader is ours rather than `safetensors.safe_open`: that one needs a tensor framework,
and checks the whole file against the header, which a checkpoint still downloading fails; we need
the header's JSON only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

WeightsSource = Literal["index", "safetensors_headers", "gguf", "file_sizes", "arithmetic"]
"""Where a spec's weight bytes come from: the index's total_size, the safetensors headers, a GGUF's
tensor table (its file sizes), the weight files' sizes (.bin, unreadable headers), or config.json's
arithmetic (no weights on disk)."""

INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
MAX_HEADER = 100 * 2**20
"""safetensors' own limit on the header's size."""
TOLERANCE = 0.03


class HeaderError(ValueError):
    pass


@dataclass(frozen=True)
class Stated:
    bytes: int
    source: WeightsSource
    files: tuple[Path, ...] = ()


def _json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def safetensors_data_bytes(path: Path) -> int:
    """Bytes of tensor data one .safetensors file declares in its header."""
    with open(path, "rb") as f:
        size = path.stat().st_size
        raw = f.read(8)
        if len(raw) < 8:
            raise HeaderError("shorter than the 8-byte header length")
        n = int.from_bytes(raw, "little")
        if n == 0 or n > MAX_HEADER or n > size - 8:
            raise HeaderError(f"header length {n} does not fit a {size}-byte file")
        try:
            header = json.loads(f.read(n))
        except ValueError as exc:
            raise HeaderError(f"header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise HeaderError("header is not a JSON object")
    total = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = info["data_offsets"]
            total += int(end) - int(start)
        except (KeyError, TypeError, ValueError):
            raise HeaderError(f"tensor {name!r} has no data_offsets") from None
    return total


def _inside(path: Path, name: str) -> bool:
    """An index names files in its own directory: `../` or an absolute path is not a weight file."""
    return not Path(name).is_absolute() and ".." not in Path(name).parts


def _index_files(path: Path) -> tuple[int | None, list[Path], str | None]:
    """(total_size, the files the index names, a note) from the first index present."""
    for name in INDEXES:
        index = path / name
        if not index.is_file():
            continue
        data = _json(index)
        if data is None:
            return None, [], f"{name} is not a JSON object: ignored"
        weight_map = data.get("weight_map")
        names = sorted({str(v) for v in weight_map.values()}) if isinstance(weight_map, dict) else []
        files = [path / n for n in names if _inside(path, n)]
        meta = data.get("metadata")
        size = meta.get("total_size") if isinstance(meta, dict) else None
        if isinstance(size, (int, float)) and not isinstance(size, bool) and size > 0:
            return int(size), files, None
        return None, files, None
    return None, [], None


def weight_files(path: Path) -> list[Path]:
    """The files an engine loads: those the index names, else all .safetensors, else .bin.

    Repositories often ship the same weights twice (consolidated.safetensors beside the sharded
    model-0000N files, or .bin beside .safetensors); counting both would double the size.
    """
    _, listed, _ = _index_files(path)
    present = [p for p in listed if p.is_file()]
    if present:
        return present
    safetensors = sorted(path.glob("*.safetensors"))
    return safetensors or sorted(path.glob("*.bin"))


SHARD = re.compile(r"^(?P<stem>.+)-(?P<n>\d{5})-of-(?P<count>\d{5})\.(?P<ext>safetensors|bin)$")


def missing_files(path: Path, files: list[Path]) -> list[str]:
    """Weight files the index names, or the -0000N-of-0000M naming implies, that are not on disk."""
    _, listed, _ = _index_files(path)
    names = {p.name for p in listed}
    for f in files:
        m = SHARD.match(f.name)
        if m:
            count = int(m.group("count"))
            names |= {f"{m.group('stem')}-{i:05d}-of-{count:05d}.{m.group('ext')}" for i in range(1, count + 1)}
    return sorted(n for n in names if not (path / n).is_file())


def stated_bytes(path: Path) -> tuple[Stated | None, list[str]]:
    """The checkpoint's own figure for its weights (None: no weights or index, or some shards missing),
    and notes on what could not be read."""
    total, _, note = _index_files(path)
    notes = [note] if note else []
    files = weight_files(path)
    if total is not None:
        return Stated(total, "index", tuple(files)), notes
    if not files:
        return None, notes
    missing = missing_files(path, files)
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        notes.append(f"{len(missing)} weight file(s) of the checkpoint are not on disk ({shown}) and no index states "
                     "the total: the weights are sized by the config arithmetic, not by the files present")
        return None, notes
    if all(f.suffix == ".safetensors" for f in files):
        try:
            return Stated(sum(safetensors_data_bytes(f) for f in files), "safetensors_headers", tuple(files)), notes
        except (HeaderError, OSError) as exc:
            notes.append(f"a safetensors header did not read ({exc}): the files' sizes are used")
    return Stated(sum(f.stat().st_size for f in files), "file_sizes", tuple(files)), notes


SOURCE_TEXT: dict[str, str] = {
    "index": "the checkpoint index's metadata.total_size",
    "safetensors_headers": "the safetensors headers",
    "gguf": "the GGUF files (parameters from their tensor table)",
    "file_sizes": "the weight files' sizes",
    "arithmetic": "config.json arithmetic (parameters x bits per weight; no weights on disk)",
}


def disagreement(stated: int, source: WeightsSource, arithmetic: int | None) -> str | None:
    """A warning naming both figures when the checkpoint and the arithmetic differ by more than 3 %."""
    if not arithmetic or source == "arithmetic" or stated <= 0:
        return None
    gap = abs(stated - arithmetic) / arithmetic
    if gap <= TOLERANCE:
        return None
    return (f"weights: {SOURCE_TEXT[source]} states {stated / 1e9:.1f} GB, the config arithmetic "
            f"{arithmetic / 1e9:.1f} GB ({gap:.0%} apart): the plan uses the checkpoint's {stated / 1e9:.1f} GB; "
            "check the config (or the quantisation) if the checkpoint is complete")

