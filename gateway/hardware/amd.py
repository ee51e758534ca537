"""AMD GPU probe: amdsmi when importable, else `rocm-smi --json`.

Both paths produce the same record, {"source", "gpus": [{"index", "name", "vram_bytes",
"link_type"}]}, which `parse_amd_record` turns into `AmdInfo`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gateway.hardware.figures import figures_for
from gateway.hardware.models import AmdGpu, AmdInfo
from gateway.hardware.sources import ProbeUnavailable, Sources

ROCM_SMI = ["rocm-smi", "--showproductname", "--showmeminfo", "vram", "--showtopotype", "--json"]


def read_amdsmi() -> dict[str, Any]:
    try:
        import amdsmi
    except ImportError as exc:
        raise ProbeUnavailable("amdsmi is not importable") from exc
    amdsmi.amdsmi_init()
    try:
        handles = amdsmi.amdsmi_get_processor_handles()
        gpus = []
        for i, h in enumerate(handles):
            link = None
            for j, other in enumerate(handles):
                if j != i:
                    kind = amdsmi.amdsmi_topo_get_link_type(h, other)["type"]
                    link = "XGMI" if kind == amdsmi.AmdSmiIoLinkType.XGMI else "PCIE"
                    break
            gpus.append(
                {
                    "index": i,
                    "name": amdsmi.amdsmi_get_gpu_asic_info(h)["market_name"],
                    "vram_bytes": int(amdsmi.amdsmi_get_gpu_vram_info(h)["vram_size"]) * 2**20,
                    "link_type": link,
                }
            )
        return {"source": "amdsmi", "gpus": gpus}
    finally:
        amdsmi.amdsmi_shut_down()


def rocm_smi_record(text: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(text)
    links: dict[int, str] = {}
    for key, value in (data.get("system") or {}).items():
        m = re.search(r"Link type between DRM devices (\d+) and (\d+)", key)
        if m:
            for dev in (int(m.group(1)), int(m.group(2))):
                links.setdefault(dev, str(value).upper())
    gpus = []
    for card, fields in sorted(data.items()):
        m = re.fullmatch(r"card(\d+)", card)
        if not m:
            continue
        index = int(m.group(1))
        vram = fields.get("VRAM Total Memory (B)")
        gpus.append(
            {
                "index": index,
                "name": fields.get("Card Series") or fields.get("Card series") or fields.get("Card model"),
                "vram_bytes": int(vram) if vram is not None else None,
                "link_type": links.get(index),
            }
        )
    return {"source": "rocm-smi", "gpus": gpus}


def parse_amd_record(record: dict[str, Any]) -> AmdInfo:
    return AmdInfo(
        source=str(record["source"]),
        gpus=tuple(
            AmdGpu(
                index=int(g["index"]),
                name=str(g["name"]),
                memory_total_bytes=g.get("vram_bytes"),
                link_type=g.get("link_type"),
                figures=figures_for(str(g["name"])),
            )
            for g in record["gpus"]
        ),
    )


def probe_amd(sources: Sources) -> AmdInfo | None:
    try:
        return parse_amd_record(sources.amdsmi_record())
    except ProbeUnavailable:
        pass
    text = sources.run(ROCM_SMI, timeout=10)
    if text is None:
        return None
    info = parse_amd_record(rocm_smi_record(text))
    return info if info.gpus else None
