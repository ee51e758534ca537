"""What a model's LoRA adapters change in its plan: the engine (one that selects an adapter per request) and
the memory charged for it (the adapters' weights, beside the base's)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from adapters import lora
from gateway.lora.summary import LoraPlan, PlannedAdapter
from gateway.planning import Plan

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


def slot_bytes(slots: int, rank: int, layers: int | None, hidden: int | None, heads: int | None,
               kv_heads: int | None, head_dim: int | None) -> int | None:
    """The attention projections' LoRA buffers for `slots` adapters of `rank`, 16-bit: per layer and slot,
    A and B of q, k, v and o (rank x (in + out) each). None when the model's shape is not known."""
    if not all((layers, hidden, heads)):
        return None
    assert layers is not None and hidden is not None and heads is not None
    d = head_dim or hidden // heads
    q, kv = heads * d, (kv_heads or heads) * d
    widths = (hidden + q) + 2 * (hidden + kv) + (q + hidden)
    return slots * rank * widths * layers * 2


def summarise(engine: str, adapters: Sequence[Mapping[str, Any]], options: Mapping[str, Any],
              shape: Mapping[str, int | None] | None = None) -> LoraPlan:
    """The adapters and the LoRA flags `engine` gets for them (`adapters`: `options.lora_adapters` entries)."""
    chosen = lora.lora_adapters({"lora_adapters": list(adapters)})
    sizes = {path: adapter_bytes([path]) for path in lora.files(chosen)}
    planned = tuple(PlannedAdapter(name=a.name, path=a.path, scale=a.scale, bytes=sizes[a.path]) for a in chosen)
    total = sum(sizes.values())
    if engine not in PER_REQUEST_ENGINES:
        return LoraPlan(adapters=planned, engine_flags=(), loading="start", loaded_at_once=0, file_bytes=total,
                        note=f"{engine} cannot select an adapter per request: a request for one is refused "
                             f"(serve the model with {', '.join(PER_REQUEST_ENGINES)})")
    if engine == "llama_server":
        return LoraPlan(adapters=planned, engine_flags=tuple(lora.llama_server_args(chosen)), loading="start",
                        loaded_at_once=len(sizes), file_bytes=total)
    try:
        flags = lora.sglang_args(chosen, options) if engine == "sglang" else lora.vllm_args(chosen, options)
        summary = lora.lora_flags(chosen, options)
    except ValueError as exc:  # the engine refuses these options at start, saying the same
        return LoraPlan(adapters=planned, engine_flags=(), loading="start", loaded_at_once=0, file_bytes=total,
                        note=str(exc))
    dims = shape or {}
    reserve = slot_bytes(summary["slots"], summary["max_rank"], dims.get("layers"), dims.get("hidden_size"),
                         dims.get("attention_heads"), dims.get("kv_heads"), dims.get("head_dim"))
    return LoraPlan(adapters=planned, engine_flags=tuple(flags), loading=summary["loading"],
                    loaded_at_once=summary["loaded_at_once"], slots=summary["slots"], max_rank=summary["max_rank"],
                    file_bytes=total, slot_bytes=reserve)


def for_plan(plan: Plan, adapters: Sequence[Mapping[str, Any]], options: Mapping[str, Any]) -> Plan:
    """The plan with its adapters' summary (`Plan.lora`); unchanged without adapters."""
    if not adapters:
        return plan
    spec = plan.spec
    shape = None if spec is None else {"layers": spec.layers, "hidden_size": spec.hidden_size,
                                       "attention_heads": spec.attention_heads, "kv_heads": spec.kv_heads,
                                       "head_dim": spec.head_dim}
    return plan.model_copy(update={"lora": summarise(plan.engine, adapters, options, shape)})
