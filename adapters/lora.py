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
