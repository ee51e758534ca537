"""Engine name -> adapter class.

Built-in adapters are registered exactly as a third-party one would be: by one call to
`register`. Built-ins are listed by import path and imported on first use, so an engine
whose Python package is missing only fails when it is chosen. Third-party packages may
also expose adapters through the `enginegate.adapters` entry-point group.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from adapters.base import Adapter

_BUILTIN: dict[str, str] = {
    "llamacpp": "adapters.llamacpp:LlamaCppAdapter",
    "mlx": "adapters.mlx:MLXAdapter",
    "mlx_server": "adapters.mlx_server:MLXServerAdapter",
    "exllamav2": "adapters.exllama:ExLlamaV2Adapter",
    "exllamav3": "adapters.exllama:TabbyAdapter",
    "vllm": "adapters.vllm:VllmAdapter",
    "sglang": "adapters.sglang:SGLangAdapter",
    "tensorrt_llm": "adapters.tensorrt_llm:TensorRTLLMAdapter",
    "dynamo": "adapters.dynamo:DynamoAdapter",
    "llama_server": "adapters.llama_server:LlamaServerAdapter",
    "openai": "adapters.external:ExternalAdapter",
    "external": "adapters.external:ExternalAdapter",
}
_registered: dict[str, type[Adapter]] = {}


def register(name: str, adapter: type[Adapter]) -> type[Adapter]:
    _registered[name] = adapter
    return adapter


def builtin(name: str, import_path: str) -> None:
    """Declare a built-in adapter by import path (imported lazily)."""
    _BUILTIN[name] = import_path


def names() -> list[str]:
    plugin_names = {ep.name for ep in entry_points(group="enginegate.adapters")}
    return sorted(set(_BUILTIN) | set(_registered) | plugin_names)


def get(name: str) -> type[Adapter]:
    if name in _registered:
        return _registered[name]
    if name in _BUILTIN:
        module_name, _, attr = _BUILTIN[name].partition(":")
        return register(name, getattr(importlib.import_module(module_name), attr))
    for ep in entry_points(group="enginegate.adapters"):
        if ep.name == name:
            return register(name, ep.load())
    raise KeyError(f"no adapter named {name!r}; known: {', '.join(names())}")
