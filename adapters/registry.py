"""Engine name -> its `EngineSpec`.

Built-in engines are declared exactly as a third-party one is: one `EngineSpec` in the engine's
module. Built-ins are listed by import path and imported on first use; third-party packages
expose an `EngineSpec` through the `enginegate.adapters` entry-point group (or call `register`).
The planner and the runtime ask only this module, so a plugin is planned and served like a
built-in.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from adapters.base import Adapter
from adapters.config import EngineConfig
from adapters.spec import EngineSpec

ENTRY_POINTS = "enginegate.adapters"

_BUILTIN: dict[str, str] = {
    "llamacpp": "adapters.llamacpp:SPEC",
    "mlx": "adapters.mlx:SPEC",
    "mlx_server": "adapters.mlx_server:SPEC",
    "exllamav2": "adapters.exllama:EXLLAMAV2",
    "exllamav3": "adapters.exllama:EXLLAMAV3",
    "vllm": "adapters.vllm:SPEC",
    "sglang": "adapters.sglang:SPEC",
    "tensorrt_llm": "adapters.tensorrt_llm:SPEC",
    "dynamo": "adapters.dynamo:SPEC",
    "llama_server": "adapters.llama_server:SPEC",
    "openai": "adapters.external:SPEC",
    "external": "adapters.external:SPEC",
}
_registered: dict[str, EngineSpec] = {}


class UnknownEngineError(KeyError, ValueError):
    """No engine of that name is built in, registered or installed as a plugin."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"unknown engine {self.name!r}; known: {', '.join(names())}"


def register(spec: EngineSpec, name: str | None = None) -> EngineSpec:
    if not isinstance(spec, EngineSpec):
        raise TypeError(f"an engine registers an adapters.spec.EngineSpec, got {spec!r}")
    _registered[name or spec.name] = spec
    return spec


def names() -> list[str]:
    plugin_names = {ep.name for ep in entry_points(group=ENTRY_POINTS)}
    return sorted(set(_BUILTIN) | set(_registered) | plugin_names)


def spec(name: str) -> EngineSpec:
    if name in _registered:
        return _registered[name]
    if name in _BUILTIN:
        module_name, _, attr = _BUILTIN[name].partition(":")
        return register(getattr(importlib.import_module(module_name), attr), name)
    for ep in entry_points(group=ENTRY_POINTS):
        if ep.name == name:
            loaded = ep.load()
            if not isinstance(loaded, EngineSpec):
                raise TypeError(f"entry point {ep.value!r} ({ENTRY_POINTS}:{name}) must name an EngineSpec, "
                                f"got {type(loaded).__name__}")
            return register(loaded, name)
    raise UnknownEngineError(name)


def specs() -> list[EngineSpec]:
    """Every engine known here, each once (aliases such as `external` left out)."""
    seen: dict[str, EngineSpec] = {}
    for name in names():
        found = spec(name)
        seen.setdefault(found.name, found)
    return list(seen.values())


def create(name: str, config: EngineConfig) -> Adapter:
    return spec(name).create(config)
