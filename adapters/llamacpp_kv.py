"""The in-process llama.cpp engine's KV cache type: llama-cpp-python's `type_k`/`type_v` (ggml type ids).

A quantised V cache needs flash attention in llama.cpp (it refuses a quantised V without it), so
q8_0 and q4_0 turn `flash_attn` on; f16 leaves llama.cpp's default. The names are llama.cpp's own
(-ctk/-ctv), the same the llama-server adapter takes as `kv_cache_type`."""

from __future__ import annotations

from typing import Any

from adapters.base import EngineError

GGML_TYPES = {"f16": 1, "q8_0": 8, "q4_0": 2}
"""ggml_type ids (ggml.h: GGML_TYPE_F16 = 1, GGML_TYPE_Q4_0 = 2, GGML_TYPE_Q8_0 = 8)."""
BYTES_PER_ELEMENT = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
"""A block of 32 values: q8_0 32 bytes + an f16 scale, q4_0 16 bytes + an f16 scale."""
QUANTISED = ("q8_0", "q4_0")
"""What the planner may set (layout_options) where fp16 KV would push layers off the GPU or cut the context."""


def kv_cache_type(options: dict[str, Any]) -> str:
    kind = str(options.get("kv_cache_type") or "f16")
    if kind not in GGML_TYPES:
        raise EngineError(f"unknown kv_cache_type {kind!r}; one of {', '.join(sorted(GGML_TYPES))}", 503,
                          "invalid_engine_options")
    return kind


def llama_kwargs(kind: str) -> dict[str, Any]:
    """The `Llama(...)` arguments for this KV type (none for f16: llama.cpp's default)."""
    if kind == "f16":
        return {}
    return {"type_k": GGML_TYPES[kind], "type_v": GGML_TYPES[kind], "flash_attn": True}
