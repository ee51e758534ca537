"""What does reading the checkpoint's own word cost at start-up, and how close is the arithmetic?

    python -m benchmarks.checkpoint_sizes [--shards 163] [--tensors 560] [--rounds 5]

A DeepSeek-V3-sized checkpoint (163 safetensors shards of FP8 tensors, 688.6 GB declared) is written
as sparse files: real headers, the data left as holes, so only a header read can size it. `load_spec`
on that directory is timed three ways, interleaved round by round: sized by the index's total_size,
by the safetensors headers (no index), and by config.json alone (the arithmetic). Medians are
printed with the ratio to the config-only load. Then the layer arithmetic against the published
totals of the fixture configs (tests/unit/planning/test_layer_arithmetic.py holds the same table).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from gateway.planning import load_spec
from tests.unit.hosts import MODELS
from tests.unit.planning.test_layer_arithmetic import PUBLISHED

TOTAL = 688_586_727_753
"""Bytes the DeepSeek-V3 FP8 index states (MTP layer included)."""


def write_checkpoint(root: Path, shards: int, tensors: int) -> tuple[Path, Path, Path]:
    """(headers only, index + headers, config only) directories."""
    headers, indexed, config = root / "headers", root / "indexed", root / "config"
    for d in (headers, indexed, config):
        d.mkdir()
        shutil.copy(MODELS / "deepseek-v3" / "config.json", d / "config.json")
    size = TOTAL // (shards * tensors)
    for i in range(1, shards + 1):
        header: dict[str, object] = {"__metadata__": {"format": "pt"}}
        for t in range(tensors):
            header[f"model.layers.{i}.t{t}.weight"] = {"dtype": "F8_E4M3", "shape": [size],
                                                       "data_offsets": [t * size, (t + 1) * size]}
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        for d in (headers, indexed):
            with open(d / name, "wb") as f:
                f.write(len(raw).to_bytes(8, "little") + raw)
                f.truncate(8 + len(raw) + tensors * size)
    weight_map = {f"t{i}": f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)}
    (indexed / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": TOTAL}, "weight_map": weight_map}))
    return headers, indexed, config


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", type=int, default=163)
    parser.add_argument("--tensors", type=int, default=560, help="tensors per shard")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="checkpoint-sizes-"))
    try:
        dirs = dict(zip(("headers", "index", "config"), write_checkpoint(root, args.shards, args.tensors)))
        times: dict[str, list[float]] = {k: [] for k in dirs}
        sizes: dict[str, tuple[str, float]] = {}
        for _ in range(args.rounds):
            for name, d in dirs.items():
                start = time.perf_counter()
                spec = load_spec(d)
                times[name].append(time.perf_counter() - start)
                sizes[name] = (spec.weights_source, (spec.weight_bytes or 0) / 1e9)
        base = statistics.median(times["config"])
        print(f"load_spec on a {args.shards}-shard checkpoint ({args.tensors} tensors a shard), "
              f"median of {args.rounds} interleaved rounds:")
        for name, ts in times.items():
            source, gb = sizes[name]
            med = statistics.median(ts)
            print(f"  {name:8} {med * 1000:8.1f} ms  {med / base:6.1f}x config-only  {gb:7.1f} GB from {source}")
    finally:
        shutil.rmtree(root)
    print("layer arithmetic against the published totals:")
    for row in PUBLISHED:
        spec = load_spec(MODELS / row.fixture)
        total = spec.params_total or 0
        active = f"{(spec.params_active or 0) / 1e9:6.2f}B active" + (
            f" ({row.active / 1e9:g}B)" if row.active else " (no precise published figure)")
        print(f"  {row.fixture:22} {total / 1e9:7.2f}B ({row.total / 1e9:g}B, {(total - row.total) / row.total:+.1%})"
              f"  {active}")


if __name__ == "__main__":
    main()
