"""Display and accelerator devices read from lspci, or /sys/class/drm where lspci is missing."""

from __future__ import annotations

from typing import Any

from gateway.commands.detect import describe
from gateway.hardware.pci import parse_lspci, probe_pci
from tests.unit.hosts import HOSTS, host


def test_lspci_lists_the_gpu_and_leaves_out_the_bmc_display_and_other_devices() -> None:
    devices = parse_lspci((HOSTS / "intel-arc-a770" / "lspci.txt").read_text())
    assert [(d.address, d.vendor_id, d.device_id, d.name) for d in devices] == [
        ("0000:03:00.0", "8086", "56a0", "DG2 [Arc A770]")]
    assert host("intel-arc-a770").pci_devices == devices
    assert host("build-machine").pci_devices == ()


class DrmOnly:
    """A host without lspci whose kernel lists one Tenstorrent card and one virtio display under /sys/class/drm."""

    FILES = {"/sys/class/drm/card0/device/vendor": "0x1af4\n", "/sys/class/drm/card0/device/class": "0x030000\n",
             "/sys/class/drm/card1/device/vendor": "0x1e52\n", "/sys/class/drm/card1/device/device": "0x401e\n",
             "/sys/class/drm/card1/device/class": "0x120000\n",
             "/sys/class/drm/card1/device/uevent": "DRIVER=tenstorrent\nPCI_SLOT_NAME=0000:41:00.0\n"}

    def run(self, argv: list[str], timeout: float) -> str | None:
        return None

    def read_text(self, path: str) -> str | None:
        return self.FILES.get(path)


def test_without_lspci_the_drm_class_names_the_card() -> None:
    devices = probe_pci(DrmOnly())  # type: ignore[arg-type]
    assert [(d.address, d.vendor, d.device_id, d.source) for d in devices] == [
        ("0000:41:00.0", "Tenstorrent", "401e", "drm")]
    assert "driver tenstorrent" in devices[0].name


def test_garbled_lspci_lines_are_skipped() -> None:
    lines: Any = 'bad "unterminated\n0000:01:00.0 "3D controller [0302]" "NVIDIA Corporation [10de]" "GH100 [2330]"\n'
    assert [d.vendor_id for d in parse_lspci(lines)] == ["10de"]


def test_detect_lists_the_pci_devices() -> None:
    assert "PCI     0000:03:00.0 Intel Corporation DG2 [Arc A770] (from lspci)" in describe(host("intel-arc-a770"))
