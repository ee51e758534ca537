"""Display and accelerator devices on the PCI bus (`lspci -mm -nn -D`, else /sys/class/drm), whatever
their vendor: the planner names the ones no probe or engine covers instead of planning silently for the CPU."""

from __future__ import annotations

import re
import shlex

from gateway.hardware.models import PciDevice
from gateway.hardware.sources import Sources

LSPCI = ["lspci", "-mm", "-nn", "-D"]
ACCELERATOR_CLASSES = frozenset({"0300", "0302", "0380", "1200"})
"""VGA, 3D, other display controllers and processing accelerators."""
CONSOLE_VENDORS = frozenset({"1a03", "102b", "1af4", "1234", "15ad", "1414", "1013"})
"""Server BMC and virtual display adapters (ASPEED, Matrox, virtio, QEMU, VMware, Hyper-V, Cirrus): never compute."""
VENDORS = {"10de": "NVIDIA", "1002": "AMD", "8086": "Intel", "1da3": "Habana Labs (Intel Gaudi)", "1e52": "Tenstorrent",
           "1ed5": "Moore Threads", "19e5": "Huawei", "17cb": "Qualcomm", "1d0f": "Amazon"}
DRM_CARDS = 16
_ID = re.compile(r"^(?P<name>.*?)\s*\[(?P<id>[0-9a-f]{4})\]$")


def _split(field: str) -> tuple[str, str]:
    m = _ID.match(field.strip())
    return (m.group("name"), m.group("id")) if m else (field.strip(), "")


def parse_lspci(text: str) -> tuple[PciDevice, ...]:
    """Accelerator-class devices from `lspci -mm -nn -D` (slot "class [cccc]" "vendor [vvvv]" "device [dddd]" ...)."""
    devices = []
    for line in text.splitlines():
        try:
            fields = [f for f in shlex.split(line) if not f.startswith("-")]
        except ValueError:
            continue
        if len(fields) < 4:
            continue
        _, cls = _split(fields[1])
        vendor, vendor_id = _split(fields[2])
        name, device_id = _split(fields[3])
        if cls in ACCELERATOR_CLASSES and vendor_id not in CONSOLE_VENDORS:
            devices.append(PciDevice(address=fields[0], vendor_id=vendor_id, device_id=device_id,
                                     vendor=vendor, name=name, source="lspci"))
    return tuple(devices)


def _hex(text: str | None) -> str:
    return text.strip().lower().removeprefix("0x")[-4:] if text else ""


def read_drm(sources: Sources) -> tuple[PciDevice, ...]:
    """GPUs with a kernel DRM driver: /sys/class/drm/cardN/device/{vendor,device,class,uevent}."""
    devices = []
    for n in range(DRM_CARDS):
        base = f"/sys/class/drm/card{n}/device"
        vendor_id = _hex(sources.read_text(f"{base}/vendor"))
        if not vendor_id:
            continue
        cls = _hex((sources.read_text(f"{base}/class") or "").strip()[:6])
        if vendor_id in CONSOLE_VENDORS or (cls and cls not in ACCELERATOR_CLASSES):
            continue
        uevent = sources.read_text(f"{base}/uevent") or ""
        slot = next((line.split("=", 1)[1] for line in uevent.splitlines() if line.startswith("PCI_SLOT_NAME=")), f"card{n}")
        driver = next((line.split("=", 1)[1] for line in uevent.splitlines() if line.startswith("DRIVER=")), None)
        vendor = VENDORS.get(vendor_id, f"PCI vendor {vendor_id}")
        devices.append(PciDevice(address=slot, vendor_id=vendor_id, device_id=_hex(sources.read_text(f"{base}/device")),
                                 vendor=vendor, name=f"{vendor} GPU" + (f" (driver {driver})" if driver else ""),
                                 source="drm"))
    return tuple(devices)


def probe_pci(sources: Sources) -> tuple[PciDevice, ...]:
    text = sources.run(LSPCI, timeout=10)
    return parse_lspci(text) if text is not None else read_drm(sources)
