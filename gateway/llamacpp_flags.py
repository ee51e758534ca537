"""Print the CMake arguments that build llama.cpp for the CPU this runs on.

Standard library only: the bootstrap runs it by path (`python gateway/llamacpp_flags.py`) before
any dependency is installed; `enginegate engines install` imports it.
x86-64: never -march=native and never AMX (ggml's AMX path dies with SIGILL on some
Sapphire Rapids hosts); each SIMD level is switched on only when /proc/cpuinfo lists it.
Other architectures keep llama.cpp's own defaults for the build CPU.
`--portable` (container images, which run on CPUs other than the one that built them): x86-64
gets the x86-64-v3 baseline (AVX2, FMA, F16C, BMI2; no AVX-512, no AMX) whatever the build CPU
has; other architectures turn native tuning off.
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path

# (cpuinfo flag, ggml CMake option) in the order ggml documents them.
X86_FEATURES: tuple[tuple[str, str], ...] = (
    ("sse4_2", "GGML_SSE42"),
    ("avx", "GGML_AVX"),
    ("avx2", "GGML_AVX2"),
    ("bmi2", "GGML_BMI2"),
    ("fma", "GGML_FMA"),
    ("f16c", "GGML_F16C"),
    ("avx_vnni", "GGML_AVX_VNNI"),
    ("avx512f", "GGML_AVX512"),
    ("avx512vbmi", "GGML_AVX512_VBMI"),
    ("avx512_vnni", "GGML_AVX512_VNNI"),
    ("avx512_bf16", "GGML_AVX512_BF16"),
)
ALWAYS_OFF = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")
# x86-64-v3 (Haswell, 2013, and every later x86 server/desktop CPU): what a portable image assumes.
PORTABLE_X86 = frozenset({"sse4_2", "avx", "avx2", "bmi2", "fma", "f16c"})
COMMON = ("-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF")


def cpu_flags(cpuinfo: str) -> set[str]:
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cmake_args(machine: str, cpuinfo: str, portable: bool = False) -> list[str]:
    if machine.lower() not in {"x86_64", "amd64"}:
        return ["-DGGML_NATIVE=OFF", *COMMON] if portable else [*COMMON]
    flags = set(PORTABLE_X86) if portable else cpu_flags(cpuinfo)
    args = ["-DGGML_NATIVE=OFF"]
    args += [f"-D{opt}={'ON' if flag in flags else 'OFF'}" for flag, opt in X86_FEATURES]
    args += [f"-D{opt}=OFF" for opt in ALWAYS_OFF]
    return [*args, *COMMON]


def host_cmake_args(portable: bool = False) -> list[str]:
    """The arguments for the CPU this runs on (or the portable baseline)."""
    cpuinfo_path = Path("/proc/cpuinfo")
    cpuinfo = cpuinfo_path.read_text() if cpuinfo_path.exists() else ""
    return cmake_args(platform.machine(), cpuinfo, portable=portable)


def main() -> int:
    print(" ".join(host_cmake_args(portable="--portable" in sys.argv[1:])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
