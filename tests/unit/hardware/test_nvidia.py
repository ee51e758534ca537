import json

import pytest

from gateway.hardware.nvidia import parse_nvml, read_nvml
from gateway.hardware.sources import ProbeUnavailable
from tests.unit.hosts import HOSTS


def record(name: str) -> dict:
    return json.loads((HOSTS / name / "nvml.json").read_text())


def test_hgx_h100_all_gpus_reach_each_other_through_nvswitch() -> None:
    info = parse_nvml(record("hgx-8x-h100"))
    assert info.driver_version == "550.54.15" and info.cuda_version == "12.4"
    assert len(info.gpus) == 8
    for g in info.gpus:
        assert g.nvswitch and g.nvlink_active_links == 18
        assert set(g.nvlink_peers) == set(range(8)) - {g.index}
        assert g.compute_capability == (9, 0)
        assert g.memory_total_bytes == 81559 * 2**20
        assert g.figures.memory_bandwidth_gbps == 3350  # "H100 80GB HBM3" is the SXM part


def test_a100_direct_nvlink_peers_from_remote_bus_ids() -> None:
    info = parse_nvml(record("4x-a100-nvlink"))
    assert all(not g.nvswitch and set(g.nvlink_peers) == {0, 1, 2, 3} - {g.index} for g in info.gpus)
    assert all(g.nvlink_active_links == 12 for g in info.gpus)


def test_rtx_4090_pair_has_no_nvlink() -> None:
    info = parse_nvml(record("2x-rtx-4090"))
    assert [g.nvlink_peers for g in info.gpus] == [(), ()]
    assert info.gpus[0].pcie_generation == 4 and info.gpus[0].pcie_width == 8


def test_rtx_2080_ti_compute_capability_7_5() -> None:
    g = parse_nvml(record("rtx-2080-ti")).gpus[0]
    assert g.compute_capability == (7, 5)
    assert g.figures.memory_bandwidth_gbps == 616


def test_unknown_gpu_has_null_figures_and_null_fields_stay_null() -> None:
    rec = {
        "driver_version": None,
        "cuda_driver_version": None,
        "gpus": [{"index": 0, "name": "NVIDIA Imaginary 9000", "memory_total": None, "compute_capability": None}],
    }
    info = parse_nvml(rec)
    g = info.gpus[0]
    assert g.figures.memory_bandwidth_gbps is None and g.figures.peak_dense_tflops is None
    assert g.compute_capability is None and g.memory_total_bytes is None and g.mig_enabled is None
    assert info.cuda_version is None


def test_real_nvml_on_this_host() -> None:
    """On a machine without the NVIDIA driver the real library raises; on one with it, the record parses."""
    try:
        rec = read_nvml()
    except ProbeUnavailable as exc:
        assert "NVML" in str(exc) or "nvidia-ml-py" in str(exc)
        return
    assert parse_nvml(rec).gpus  # pragma: no cover - only on GPU machines


def test_missing_library_reason_is_kept() -> None:
    with pytest.raises(ProbeUnavailable):
        from gateway.hardware.sources import RecordedSources

        RecordedSources(HOSTS / "no-nvml").nvml_record()
