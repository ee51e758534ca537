"""Engine options for a decided placement, in each engine's own vocabulary (declared by its spec)."""

from __future__ import annotations

from typing import Any

from adapters import registry
from adapters.spec import Layout

__all__ = ["Layout", "engine_options"]


def engine_options(engine: str, lay: Layout) -> dict[str, Any]:
    spec = registry.spec(engine)
    if spec.layout_options is None:
        raise KeyError(f"engine {engine!r} declares no options for a planned layout")
    return spec.layout_options(lay)
