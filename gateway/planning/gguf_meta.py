"""A fast GGUF metadata scan: key/values and the tensor table, skipping large arrays.

`gguf.GGUFReader` decodes every array (the tokenizer's vocabulary and merges) into numpy
views, which takes seconds for a small model on a busy CPU; start-up only needs scalars and
tensor shapes. The layout follows the GGUF spec (v2/v3, little-endian); type codes and
block sizes come from the gguf package. Tests check this scan against GGUFReader.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

_SCALARS: dict[int, str] = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
SMALL_ARRAY = 1024
"""Arrays up to this many items are decoded (per-layer head counts); longer ones are skipped."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    n_elements: int
    n_bytes: int


@dataclass(frozen=True)
class GgufMeta:
    fields: dict[str, Any]
    tensors: tuple[TensorInfo, ...]


class GgufFormatError(ValueError):
    pass


class _Cursor:
    def __init__(self, buf: mmap.mmap) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise GgufFormatError("truncated GGUF header")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise GgufFormatError("truncated GGUF string")
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        n = self.take("<Q")  # read before adding: `pos += take()` would add to the old pos
        self.pos += n

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            itype = self.take("<I")
            count = self.take("<Q")
            if count <= SMALL_ARRAY:
                return [self.value(itype) for _ in range(count)]
            if itype in _SCALARS:
                self.pos += count * struct.calcsize(_SCALARS[itype])
            elif itype == GGUFValueType.STRING:
                for _ in range(count):
                    self.skip_string()
            else:
                for _ in range(count):
                    self.value(itype)
            return None
        raise GgufFormatError(f"unknown GGUF value type {vtype}")


def read_gguf_meta(path: Path) -> GgufMeta:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        c = _Cursor(buf)
        if c.take("<4s") != b"GGUF":
            raise GgufFormatError("no GGUF magic")
        version = c.take("<I")
        if version not in (2, 3):
            raise GgufFormatError(f"GGUF version {version} (or big-endian) is not supported")
        n_tensors = c.take("<Q")
        n_kv = c.take("<Q")
        fields: dict[str, Any] = {}
        for _ in range(n_kv):
            key = c.string()
            fields[key] = c.value(c.take("<I"))
        tensors = []
        for _ in range(n_tensors):
            name = c.string()
            dims = [c.take("<Q") for _ in range(c.take("<I"))]
            qtype = GGMLQuantizationType(c.take("<I"))
            c.take("<Q")  # data offset
            n = prod(dims)
            block, size = GGML_QUANT_SIZES[qtype]
            tensors.append(TensorInfo(name=name, n_elements=n, n_bytes=n // block * size))
        return GgufMeta(fields=fields, tensors=tuple(tensors))
