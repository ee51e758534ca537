"""Is an engine installed here? The engine's own spec answers; plan() takes any `Installed` callable."""

from __future__ import annotations

from collections.abc import Callable

from adapters import registry

Installed = Callable[[str], bool]


def is_installed(engine: str) -> bool:
    """The engine's install check with no options set (raises KeyError for an unknown engine)."""
    return registry.spec(engine).installed()


def installed_set(engines: set[str] | frozenset[str]) -> Installed:
    """A deterministic check for tests and `--installed`: exactly these engines are present."""
    known = frozenset(engines)
    return lambda engine: engine in known
