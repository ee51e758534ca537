"""CPU probe: model, cores and the instruction sets engines care about."""

from __future__ import annotations

from gateway.hardware.models import CpuInfo
from gateway.hardware.sources import ProbeUnavailable, Sources

# /proc/cpuinfo flag (x86) or feature (arm64) -> the name we report.
_X86_SETS = {
    "avx": "avx",
    "avx2": "avx2",
    "fma": "fma",
    "f16c": "f16c",
    "avx512f": "avx512f",
    "avx512bw": "avx512bw",
    "avx512vl": "avx512vl",
    "avx512_vnni": "avx512_vnni",
    "avx512_bf16": "avx512_bf16",
    "avx512_fp16": "avx512_fp16",
    "avx_vnni": "avx_vnni",
    "amx_tile": "amx_tile",
    "amx_int8": "amx_int8",
    "amx_bf16": "amx_bf16",
}
_ARM_SETS = {
    "asimd": "neon",
    "asimddp": "dotprod",
    "i8mm": "i8mm",
    "bf16": "bf16",
    "sve": "sve",
    "sve2": "sve2",
    "sme": "sme",
}
# Apple `sysctl hw.optional.*` keys -> the same names.
_APPLE_SETS = {
    "hw.optional.neon": "neon",
    "hw.optional.arm.FEAT_DotProd": "dotprod",
    "hw.optional.arm.FEAT_I8MM": "i8mm",
    "hw.optional.arm.FEAT_BF16": "bf16",
    "hw.optional.arm.FEAT_SME": "sme",
}
# ARM "CPU part" ids (implementer 0x41, Arm Ltd) for boards whose cpuinfo has no model name.
_ARM_PARTS = {
    "0xd03": "Cortex-A53",
    "0xd08": "Cortex-A72",
    "0xd0b": "Cortex-A76",
    "0xd0c": "Neoverse-N1",
    "0xd40": "Neoverse-V1",
    "0xd49": "Neoverse-N2",
    "0xd4f": "Neoverse-V2",
}


def _cpuinfo_fields(text: str) -> list[dict[str, str]]:
    blocks: list[dict[str, str]] = [{}]
    for line in text.splitlines():
        if not line.strip():
            if blocks[-1]:
                blocks.append({})
            continue
        key, sep, value = line.partition(":")
        if sep:
            blocks[-1][key.strip()] = value.strip()
    return [b for b in blocks if b]


def parse_proc_cpuinfo(text: str, architecture: str) -> CpuInfo:
    blocks = _cpuinfo_fields(text)
    if not blocks:
        raise ValueError("/proc/cpuinfo is empty")
    first = blocks[0]
    processors = [b for b in blocks if "processor" in b]
    board = next((b["Model"] for b in blocks if "Model" in b), None)
    model = first.get("model name")
    if model is None and first.get("CPU implementer") == "0x41":
        part = _ARM_PARTS.get(first.get("CPU part", ""))
        model = f"ARM {part}" if part else None
    if board is not None:
        model = f"{model} ({board})" if model else board
    words = set((first.get("flags") or first.get("Features") or "").split())
    table = _X86_SETS if "flags" in first else _ARM_SETS
    sets = sorted({name for flag, name in table.items() if flag in words})
    cores = {(b["physical id"], b["core id"]) for b in processors if "physical id" in b and "core id" in b}
    return CpuInfo(
        model=model,
        architecture=architecture,
        logical_cores=len(processors) or None,
        physical_cores=len(cores) or None,
        instruction_sets=tuple(sets),
    )


def parse_apple_sysctl(text: str, architecture: str) -> CpuInfo:
    """`sysctl hw.physicalcpu hw.logicalcpu machdep.cpu.brand_string hw.optional` output."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            values[key.strip()] = value.strip()
    sets = sorted({name for key, name in _APPLE_SETS.items() if values.get(key) == "1"})
    if architecture == "arm64" and "neon" not in sets:
        sets = sorted({*sets, "neon"})  # every arm64 core has Advanced SIMD (NEON)
    physical = values.get("hw.physicalcpu")
    logical = values.get("hw.logicalcpu")
    return CpuInfo(
        model=values.get("machdep.cpu.brand_string"),
        architecture=architecture,
        logical_cores=int(logical) if logical else None,
        physical_cores=int(physical) if physical else None,
        instruction_sets=tuple(sets),
    )


APPLE_SYSCTL = ["sysctl", "hw.physicalcpu", "hw.logicalcpu", "machdep.cpu.brand_string", "hw.optional"]


def probe_cpu(sources: Sources) -> CpuInfo:
    architecture = sources.machine()
    if sources.system() == "Darwin":
        text = sources.run(APPLE_SYSCTL, timeout=5)
        if text is None:
            raise ProbeUnavailable("sysctl not found")
        return parse_apple_sysctl(text, architecture)
    text = sources.read_text("/proc/cpuinfo")
    if text is None:
        logical, physical = sources.cpu_counts()
        return CpuInfo(architecture=architecture, logical_cores=logical, physical_cores=physical)
    info = parse_proc_cpuinfo(text, architecture)
    logical, physical = sources.cpu_counts()
    return info.model_copy(
        update={
            "logical_cores": info.logical_cores or logical,
            "physical_cores": info.physical_cores or physical,
        }
    )
