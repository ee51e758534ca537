"""What a model's LoRA adapters change in its plan: the engine (one that selects an adapter per request) and
the memory charged for it (the adapters' weights, beside the base's)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

PER_REQUEST_ENGINES = ("llama_server", "vllm", "sglang")
"""Engines that select a LoRA adapter per request (llama-server's `lora` list, vLLM's and SGLang's adapter
model names). The in-process llama.cpp engine loads one adapter per context (llama-cpp-python's `lora_path`),
so a plan for it with adapters is served by llama-server instead."""


def adapter_bytes(paths: Sequence[str]) -> int:
    """The adapters' weights: each file once (a directory: the files in it)."""
    total = 0
    for path in dict.fromkeys(paths):
        p = Path(path)
        total += sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size
    return total


def with_adapters(charges: Mapping[str, int], extra: int) -> dict[str, int]:
    """The model's charges with its adapters' bytes added where its weights are (the first pool it holds:
    one GPU of several, the safe side; RAM where the plan named none)."""
    out = dict(charges)
    if extra <= 0:
        return out
    pool = next(iter(out), "ram")
    out[pool] = out.get(pool, 0) + extra
    return out


def engine_for_adapters(planned: str) -> str | None:
    """The engine to serve a model with adapters when the plan chose `planned` (None: keep it)."""
    return "llama_server" if planned == "llamacpp" else None
