"""Model id -> the backend that serves it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from adapters.base import Adapter
from gateway.planning import Plan
from gateway.routing.admission import Admission


@dataclass(slots=True)
class Backend:
    model_id: str
    adapter: Adapter
    admission: Admission
    plan: Plan | None = None
    aliases: tuple[str, ...] = ()
    created: int = 0
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def engine(self) -> str:
        return self.adapter.engine


class ModelRegistry:
    def __init__(self) -> None:
        self._backends: dict[str, Backend] = {}
        self._by_name: dict[str, Backend] = {}

    def add(self, backend: Backend) -> None:
        for name in (backend.model_id, *backend.aliases):
            if name in self._by_name:
                raise ValueError(f"model id {name!r} is configured twice")
            self._by_name[name] = backend
        self._backends[backend.model_id] = backend

    def get(self, name: str) -> Backend | None:
        return self._by_name.get(name)

    def __iter__(self) -> Iterator[Backend]:
        return iter(self._backends.values())

    def __len__(self) -> int:
        return len(self._backends)

    def known(self, name: str) -> bool:
        return name in self._by_name
