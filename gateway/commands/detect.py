"""`enginegate detect [--json]`: what this host has, as the planner sees it."""

from __future__ import annotations

import argparse

from gateway.hardware import HardwareSnapshot, detect


def describe(s: HardwareSnapshot) -> str:
    gib = 2**30
    lines = [s.summary(), ""]
    cpu = s.cpu
    lines.append(
        f"CPU     {cpu.model or 'unknown'} ({cpu.architecture}), "
        f"{cpu.physical_cores or '?'} cores / {cpu.logical_cores or '?'} threads"
    )
    lines.append(f"        instruction sets: {', '.join(cpu.instruction_sets) or 'none reported'}")
    if cpu.measured_bandwidth_gbps:
        lines.append(f"        measured copy bandwidth: {cpu.measured_bandwidth_gbps:.1f} GB/s")
    mem = s.memory
    total = f"{mem.total_bytes / gib:.1f} GiB" if mem.total_bytes else "unknown"
    avail = f"{mem.available_bytes / gib:.1f} GiB" if mem.available_bytes else "unknown"
    lines.append(f"RAM     {total} total, {avail} available")
    if s.nvidia:
        lines.append(f"NVIDIA  driver {s.nvidia.driver_version}, CUDA {s.nvidia.cuda_version}")
        for g in s.nvidia.gpus:
            cc = ".".join(map(str, g.compute_capability)) if g.compute_capability else "?"
            mem_g = f"{g.memory_total_bytes / gib:.0f} GiB" if g.memory_total_bytes else "? GiB"
            link = (
                f", NVLink to {list(g.nvlink_peers)}" + (" via NVSwitch" if g.nvswitch else "")
                if g.nvlink_peers
                else ""
            )
            pcie = f", PCIe gen{g.pcie_generation} x{g.pcie_width}" if g.pcie_generation else ""
            bw = f", {g.figures.memory_bandwidth_gbps:g} GB/s" if g.figures.memory_bandwidth_gbps else ""
            lines.append(
                f"  GPU {g.index} {g.name}, {mem_g}, cc {cc}{pcie}{link}{bw}" + (", MIG on" if g.mig_enabled else "")
            )
    if s.apple:
        a = s.apple
        mem_a = f"{a.unified_memory_bytes / gib:.0f} GiB" if a.unified_memory_bytes else "?"
        lines.append(f"Apple   {a.chip}, {mem_a} unified, {a.gpu_cores or '?'} GPU cores")
    if s.amd:
        for ga in s.amd.gpus:
            mem_d = f"{ga.memory_total_bytes / gib:.0f} GiB" if ga.memory_total_bytes else "? GiB"
            lines.append(f"AMD     GPU {ga.index} {ga.name}, {mem_d}, link {ga.link_type or '?'}")
    for d in s.pci_devices:
        lines.append(f"PCI     {d.address} {d.vendor} {d.name} (from {d.source})")
    for issue in s.issues:
        lines.append(f"note    {issue.probe}: {issue.reason}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    snapshot = detect()
    print(snapshot.model_dump_json(indent=2) if args.json else describe(snapshot))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("detect", help="detect this host's CPU, memory and accelerators")
    p.add_argument("--json", action="store_true", help="print the HardwareSnapshot as JSON")
    p.set_defaults(func=run)
