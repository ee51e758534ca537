"""Is an engine installed here? The default check; plan() takes any `Installed` callable."""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable

Installed = Callable[[str], bool]

_MODULES: dict[str, tuple[str, ...]] = {
    "llamacpp": ("llama_cpp",),
    "mlx": ("mlx", "mlx_lm"),
    "exllamav2": ("exllamav2",),
    "exllamav3": ("exllamav3",),
    "vllm": ("vllm",),
    "sglang": ("sglang",),
    "tensorrt_llm": ("tensorrt_llm",),
    "dynamo": ("dynamo",),
}
_BINARIES: dict[str, str] = {"llamacpp": "llama-server", "tensorrt_llm": "trtllm-serve"}


def is_installed(engine: str) -> bool:
    modules = _MODULES.get(engine)
    if modules is None:
        raise KeyError(f"unknown engine {engine!r}")
    if all(importlib.util.find_spec(m) is not None for m in modules):
        return True
    binary = _BINARIES.get(engine)
    return binary is not None and shutil.which(binary) is not None


def installed_set(engines: set[str] | frozenset[str]) -> Installed:
    """A deterministic check for tests and `--installed`: exactly these engines are present."""
    known = frozenset(engines)
    return lambda engine: engine in known
