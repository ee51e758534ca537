"""LoRA adapters served as models of their own, on the base model's engine: the engine-neutral list the
gateway passes in `options.lora_adapters`, and each engine's way of selecting one.

`options.lora_adapters` is a list of `{name, path, scale}`: `name` is the model id clients send, `path`
the adapter's file (llama.cpp: a GGUF adapter) or directory (vLLM/SGLang: a PEFT adapter). Several names
may share one file at different scales. Selection, per engine:

- llama-server loads every file at start (`--lora a.gguf,b.gguf --lora-init-without-apply`, so none is
  applied by default) and each request carries the whole list with explicit scales (`lora: [{id, scale}]`):
  an adapter left out of a request's list would run at its global scale, which another client could have
  changed through llama-server's own `/lora-adapters`, and a slot keeps no adapter between requests.
- vLLM and SGLang register each name at start (`--lora-modules name=path`, `--lora-paths name=path`) and
  a request for it names it as its `model`; the engine keeps the adapters of `--max-loras` slots on the
  GPU and evicts the least recently used itself.
- With `lora_loading: runtime` (vLLM, SGLang) none is registered at start: the gateway loads an adapter on its
  first request through the engine's own endpoint and keeps at most `max_loaded_loras` of them loaded,
  unloading the least recently used one no request is using (adapters/lora_eviction.py, lora_runtime.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class LoraAdapter:
    name: str
    path: str
    scale: float = 1.0


def lora_adapters(options: Mapping[str, Any]) -> tuple[LoraAdapter, ...]:
    raw = options.get("lora_adapters") or ()
    if not isinstance(raw, (list, tuple)):
        raise ValueError("options.lora_adapters is a list of {name, path, scale}")
    out = []
    for entry in raw:
        if not isinstance(entry, Mapping) or not entry.get("name") or not entry.get("path"):
            raise ValueError(f"options.lora_adapters: {entry!r} needs a name and a path")
        out.append(LoraAdapter(str(entry["name"]), str(entry["path"]), float(entry.get("scale", 1.0))))
    return tuple(out)


def files(adapters: tuple[LoraAdapter, ...]) -> list[str]:
    """Each adapter file once, in the order llama-server numbers them (its `id`)."""
    return list(dict.fromkeys(a.path for a in adapters))


def llama_server_args(adapters: tuple[LoraAdapter, ...]) -> list[str]:
    if not adapters:
        return []
    return ["--lora", ",".join(files(adapters)), "--lora-init-without-apply"]


def llama_server_selection(adapters: tuple[LoraAdapter, ...], model: str) -> list[dict[str, Any]] | None:
    """The request's `lora` list for the served name `model` (the base: every scale 0); None without adapters."""
    if not adapters:
        return None
    chosen = next((a for a in adapters if a.name == model), None)
    return [{"id": i, "scale": chosen.scale if chosen is not None and chosen.path == path else 0.0}
            for i, path in enumerate(files(adapters))]


def names(adapters: tuple[LoraAdapter, ...]) -> frozenset[str]:
    return frozenset(a.name for a in adapters)


DEFAULT_MAX_LORAS = 4
"""Adapters on the GPU at once (vLLM --max-loras, SGLang --max-loras-per-batch) when the options leave it open:
each slot reserves max rank x the adapted layers' widths of GPU memory; more adapters wait in CPU memory and
the engine swaps the least recently used out of a slot."""
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The --max-lora-rank values vLLM accepts."""


def peft_rank(path: str) -> int | None:
    """A PEFT adapter's rank (`r` in its adapter_config.json), or None (a file, or no config)."""
    import json
    from pathlib import Path

    config = Path(path) / "adapter_config.json"
    try:
        rank = json.loads(config.read_text()).get("r")
    except (OSError, ValueError, AttributeError):
        return None
    return int(rank) if isinstance(rank, int) and rank > 0 else None


LOADING = ("start", "runtime")


def runtime_loading(options: Mapping[str, Any]) -> bool:
    """`options.lora_loading`: `start` (every adapter registered when the engine starts; the default) or
    `runtime` (each loaded by the gateway on first use, within `max_loaded_loras`)."""
    mode = options.get("lora_loading") or "start"
    if mode not in LOADING:
        raise ValueError(f"options.lora_loading {mode!r}: one of {', '.join(LOADING)}")
    return mode == "runtime"


def runtime_capacity(adapters: tuple[LoraAdapter, ...], options: Mapping[str, Any]) -> int:
    """How many adapters the engine keeps loaded at once with runtime loading: `max_loaded_loras`, at least the
    GPU slots (vLLM's --max-cpu-loras and SGLang's --max-loaded-loras may not be fewer than the slots)."""
    slots, _ = _slots_and_rank(adapters, options)
    return max(slots, int(options.get("max_loaded_loras") or slots))


def lora_flags(adapters: tuple[LoraAdapter, ...], options: Mapping[str, Any]) -> dict[str, Any]:
    """What the plan shows of the LoRA flags chosen: slots, max rank, loading and how many stay loaded."""
    if not adapters:
        return {}
    slots, rank = _slots_and_rank(adapters, options)
    runtime = runtime_loading(options)
    return {"slots": slots, "max_rank": rank, "loading": "runtime" if runtime else "start",
            "loaded_at_once": runtime_capacity(adapters, options) if runtime else len(names(adapters))}


def _slots_and_rank(adapters: tuple[LoraAdapter, ...], options: Mapping[str, Any]) -> tuple[int, int]:
    slots = int(options.get("max_loras") or min(len(names(adapters)), DEFAULT_MAX_LORAS))
    ranks = [r for r in (peft_rank(a.path) for a in adapters) if r is not None]
    wanted = int(options.get("max_lora_rank") or max(ranks, default=16))
    return slots, next((r for r in VLLM_RANKS if r >= wanted), wanted)


def peft_targets(adapters: tuple[LoraAdapter, ...]) -> list[str]:
    """The modules the PEFT adapters adapt (`target_modules`), for an engine that sizes its LoRA buffers before
    any adapter is loaded; `all` where a config does not say."""
    import json
    from pathlib import Path

    found: list[str] = []
    for a in adapters:
        try:
            targets = json.loads((Path(a.path) / "adapter_config.json").read_text()).get("target_modules")
        except (OSError, ValueError, AttributeError):
            return ["all"]
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            return ["all"]
        found += [t for t in targets if t not in found]
    return found or ["all"]


VLLM_RUNTIME_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
"""vLLM serves /v1/load_lora_adapter and /v1/unload_lora_adapter only with this set."""


def _unscaled(adapters: tuple[LoraAdapter, ...], engine: str) -> None:
    scaled = [a.name for a in adapters if a.scale != 1.0]
    if scaled:
        raise ValueError(f"adapters {', '.join(scaled)}: {engine} applies an adapter at its trained alpha, with no "
                         "per-request scale (scale is llama.cpp's); leave scale at 1")


def vllm_args(adapters: tuple[LoraAdapter, ...], options: Mapping[str, Any]) -> list[str]:
    """vLLM's LoRA flags: every adapter registered by name; `max_loras` GPU slots, all of them in its CPU cache."""
    if not adapters:
        return []
    _unscaled(adapters, "vLLM")
    slots, rank = _slots_and_rank(adapters, options)
    if runtime_loading(options):  # loaded by the gateway through /v1/load_lora_adapter (VLLM_RUNTIME_ENV)
        return ["--enable-lora", "--max-loras", str(slots), "--max-lora-rank", str(rank),
                "--max-cpu-loras", str(runtime_capacity(adapters, options))]
    return ["--enable-lora", "--lora-modules", *(f"{a.name}={a.path}" for a in adapters), "--max-loras", str(slots),
            "--max-lora-rank", str(rank), "--max-cpu-loras", str(max(slots, len(adapters)))]


def sglang_args(adapters: tuple[LoraAdapter, ...], options: Mapping[str, Any]) -> list[str]:
    """SGLang's LoRA flags: every adapter registered by name, `max_loras` of them per batch (LRU eviction)."""
    if not adapters:
        return []
    _unscaled(adapters, "SGLang")
    slots, rank = _slots_and_rank(adapters, options)
    if runtime_loading(options):  # loaded through /load_lora_adapter; the shapes come from the target modules
        return ["--enable-lora", "--max-loras-per-batch", str(slots), "--max-lora-rank", str(rank),
                "--max-loaded-loras", str(runtime_capacity(adapters, options)),
                "--lora-target-modules", *peft_targets(adapters), "--lora-eviction-policy", "lru"]
    return ["--enable-lora", "--lora-paths", *(f"{a.name}={a.path}" for a in adapters), "--max-loras-per-batch",
            str(slots), "--max-lora-rank", str(rank), "--lora-eviction-policy", "lru"]
