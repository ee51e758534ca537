"""`enginegate doctor`: measure what detection cannot read (RAM copy bandwidth) and store it."""

from __future__ import annotations

import argparse

from gateway.hardware import detect, measure_memory_bandwidth, save_measurement


def run(args: argparse.Namespace) -> int:
    snapshot = detect()
    gbps = measure_memory_bandwidth(size_bytes=args.size_mib * 2**20, repeats=args.repeats)
    where = save_measurement(gbps, snapshot.cpu.model)
    print(f"single-thread copy bandwidth: {gbps:.1f} GB/s (read + write, best of {args.repeats})")
    print(f"stored in {where}; `enginegate plan` now estimates CPU decode speed from it")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("doctor", help="measure RAM bandwidth for the planner's speed estimates")
    p.add_argument("--size-mib", type=int, default=256, help="buffer size for the copy benchmark")
    p.add_argument("--repeats", type=int, default=5)
    p.set_defaults(func=run)
