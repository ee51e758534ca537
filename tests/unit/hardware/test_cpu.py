from pathlib import Path

import pytest

from gateway.hardware.cpu import parse_apple_sysctl, parse_proc_cpuinfo
from tests.unit.hosts import HOSTS


def test_build_machine_cpuinfo_matches_what_the_kernel_says() -> None:
    text = (HOSTS / "build-machine" / "cpuinfo.txt").read_text()
    info = parse_proc_cpuinfo(text, "x86_64")
    assert info.logical_cores == text.count("processor\t:")
    first_flags = next(line for line in text.splitlines() if line.startswith("flags")).split(":", 1)[1].split()
    assert ("avx2" in info.instruction_sets) == ("avx2" in first_flags)
    assert ("avx512f" in info.instruction_sets) == ("avx512f" in first_flags)


def test_sapphire_rapids_reports_amx_and_avx512_parts() -> None:
    info = parse_proc_cpuinfo((HOSTS / "hgx-8x-h100" / "cpuinfo.txt").read_text(), "x86_64")
    assert info.model == "Intel(R) Xeon(R) Platinum 8480+"
    assert (info.logical_cores, info.physical_cores) == (224, 112)  # 2 sockets x 56 cores x 2 threads
    assert {"amx_tile", "amx_int8", "amx_bf16", "avx512_vnni", "avx512_bf16", "avx512f"} <= set(info.instruction_sets)


def test_raspberry_pi_5_is_named_from_cpu_part_and_board() -> None:
    info = parse_proc_cpuinfo((HOSTS / "raspberry-pi-5" / "cpuinfo.txt").read_text(), "aarch64")
    assert info.model == "ARM Cortex-A76 (Raspberry Pi 5 Model B Rev 1.0)"
    assert info.logical_cores == 4
    assert info.physical_cores is None  # arm64 cpuinfo states no core ids: not guessed here
    assert "neon" in info.instruction_sets and "dotprod" in info.instruction_sets
    assert "sve" not in info.instruction_sets and "avx2" not in info.instruction_sets


def test_apple_sysctl() -> None:
    info = parse_apple_sysctl((HOSTS / "mac-studio-m3-ultra" / "sysctl.txt").read_text(), "arm64")
    assert info.model == "Apple M3 Ultra"
    assert info.physical_cores == 32
    assert {"neon", "dotprod", "i8mm", "bf16"} <= set(info.instruction_sets)
    assert "sme" not in info.instruction_sets  # hw.optional.arm.FEAT_SME: 0


def test_empty_cpuinfo_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="empty"):
        parse_proc_cpuinfo("", "x86_64")
