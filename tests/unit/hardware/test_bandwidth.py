from pathlib import Path

import pytest

from gateway.hardware.bandwidth import load_measurement, measure_memory_bandwidth, save_measurement


def test_copy_bandwidth_is_a_positive_finite_number() -> None:
    gbps = measure_memory_bandwidth(size_bytes=8 * 2**20, repeats=2)
    assert 0.1 < gbps < 10_000  # generous: checks the arithmetic (bytes/seconds/1e9), not the speed


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        measure_memory_bandwidth(size_bytes=1024)


def test_measurement_is_kept_only_for_the_same_cpu(tmp_path: Path) -> None:
    f = tmp_path / "bw.json"
    save_measurement(23.5, "AMD EPYC", f)
    assert load_measurement("AMD EPYC", f) == 23.5
    assert load_measurement("Another CPU", f) is None
    assert load_measurement("AMD EPYC", tmp_path / "missing.json") is None
