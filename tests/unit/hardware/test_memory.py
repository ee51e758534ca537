import pytest

from gateway.hardware.memory import parse_darwin, parse_proc_meminfo
from tests.unit.hosts import HOSTS


def test_proc_meminfo_in_bytes() -> None:
    info = parse_proc_meminfo("MemTotal:       16384000 kB\nMemFree: 1 kB\nMemAvailable:    8192000 kB\n")
    assert info.total_bytes == 16384000 * 1024
    assert info.available_bytes == 8192000 * 1024


def test_meminfo_without_total_is_an_error() -> None:
    with pytest.raises(ValueError, match="MemTotal"):
        parse_proc_meminfo("MemFree: 10 kB\n")


def test_darwin_available_is_free_inactive_and_speculative_pages() -> None:
    d = HOSTS / "macbook-air-m2"
    info = parse_darwin((d / "memsize.txt").read_text(), (d / "vm_stat.txt").read_text())
    assert info.total_bytes == 16 * 2**30
    # fixture: free 300000, inactive 75000, speculative 1200 pages of 16384 bytes
    assert info.available_bytes == (300000 + 75000 + 1200) * 16384


def test_darwin_without_vm_stat_leaves_available_null() -> None:
    assert parse_darwin("17179869184\n", None).available_bytes is None
