import json

import pytest

from gateway.hardware.amd import parse_amd_record, rocm_smi_record
from gateway.hardware.apple import parse_system_profiler
from tests.unit.hosts import HOSTS


def test_m3_ultra_system_profiler() -> None:
    d = HOSTS / "mac-studio-m3-ultra"
    info = parse_system_profiler((d / "system_profiler.json").read_text(), 192 * 2**30)
    assert info.chip == "Apple M3 Ultra" and info.gpu_cores == 80
    assert info.unified_memory_bytes == 192 * 2**30
    assert info.figures.memory_bandwidth_gbps == 819


def test_memory_falls_back_to_system_profiler_text() -> None:
    info = parse_system_profiler((HOSTS / "macbook-air-m2" / "system_profiler.json").read_text(), None)
    assert info.unified_memory_bytes == 16 * 2**30
    assert info.figures.memory_bandwidth_gbps == 100  # "Apple M2", not the M2 Pro/Max rows


def test_intel_mac_is_not_apple_silicon() -> None:
    text = json.dumps({"SPHardwareDataType": [{"cpu_type": "Quad-Core Intel Core i7"}], "SPDisplaysDataType": []})
    with pytest.raises(ValueError, match="chip_type"):
        parse_system_profiler(text, None)


def test_rocm_smi_json() -> None:
    info = parse_amd_record(rocm_smi_record((HOSTS / "2x-mi300x" / "rocm-smi.json").read_text()))
    assert info.source == "rocm-smi"
    assert [g.index for g in info.gpus] == [0, 1]
    assert all(g.name == "AMD Instinct MI300X OAM" and g.link_type == "XGMI" for g in info.gpus)
    assert info.gpus[0].memory_total_bytes == 196592 * 2**20
    assert info.gpus[0].figures.memory_bandwidth_gbps == 5300
