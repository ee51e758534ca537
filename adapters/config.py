"""What an adapter is built from: its own typed config, and the one rule that merges options.

An adapter never sees the gateway's settings. It gets an `EngineConfig`: where the weights are
(or the remote model's name), the id it serves them as, and one mapping of options already
merged by `resolve_options`:

    the engine's defaults  <  the plan's choices  <  what the user set explicitly

so a value the user wrote in the config (a top-level model field or a key of `options`) is the
value the engine is launched with, whatever the planner thought.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Override:
    """A choice of the plan that the user's explicit setting replaced."""

    option: str
    planned: Any
    chosen: Any


@dataclass(frozen=True, slots=True)
class ResolvedOptions:
    options: dict[str, Any]
    overridden: tuple[Override, ...] = ()


def resolve_options(
    defaults: Mapping[str, Any], planned: Mapping[str, Any], user: Mapping[str, Any]
) -> ResolvedOptions:
    """Engine defaults < plan < the user's explicit settings; None in `user` means "not set"."""
    explicit = {k: v for k, v in user.items() if v is not None}
    overridden = tuple(
        Override(k, planned[k], v) for k, v in explicit.items() if k in planned and planned[k] != v
    )
    return ResolvedOptions({**defaults, **planned, **explicit}, overridden)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """One engine instance: the model's weights (a local path, or the remote model's id) and its options."""

    source: str
    name: str = ""
    """The id clients send as `model`; empty: derived from `source`."""
    options: Mapping[str, Any] = field(default_factory=dict)
    embeddings: bool = True
    """Serve /v1/embeddings (a second engine instance in embedding mode, loaded on first use)."""
    chat_format: str | None = None

    @property
    def served(self) -> str:
        if self.name:
            return self.name
        return self.source if "/" not in self.source and "." not in self.source else Path(self.source).stem
