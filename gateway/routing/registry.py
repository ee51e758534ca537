"""Model id -> the backend that serves it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from adapters.base import Adapter
from gateway.planning import Plan
from gateway.routing.admission import Admission
from gateway.routing.pool import Lease, Replica, RouteKey

if TYPE_CHECKING:
    from gateway.routing.lifecycle import EngineChoice, Lifecycles, ModelLifecycle


@dataclass(slots=True)
class Backend:
    """One served model name. `adapter` and `admission` are its first replica's; requests go through `acquire`."""

    model_id: str
    adapter: Adapter
    admission: Admission
    plan: Plan | None = None
    aliases: tuple[str, ...] = ()
    created: int = 0
    info: dict[str, Any] = field(default_factory=dict)
    replicas: list[Replica] = field(default_factory=list)
    lifecycle: ModelLifecycle | None = None
    lifecycles: Lifecycles | None = None

    def __post_init__(self) -> None:
        if not self.replicas:
            self.replicas = [Replica(self.adapter, self.admission)]

    @property
    def engine(self) -> str:
        return self.adapter.engine

    async def acquire(self, route: RouteKey | None = None) -> Lease:
        """Make sure the model is loaded (ModelUnavailable when it cannot be now), then wait for a
        slot on a replica that can serve the request (QueueFull when none can take it)."""
        done = None
        if self.lifecycle is not None and self.lifecycles is not None:
            done = await self.lifecycles.acquire(self.lifecycle)
        replica = self.replicas[0]
        try:
            await replica.admission.acquire()
        except BaseException:
            if done is not None:
                done()
            raise
        return Lease(replica, done)

    def use(self, choice: EngineChoice) -> None:
        """Serve with another engine (the lifecycle's fallback): its replicas replace the current ones."""
        self.replicas = choice.build()
        self.adapter, self.admission = self.replicas[0].adapter, self.replicas[0].admission
        self.plan = choice.plan

    async def start(self) -> None:
        """Start every replica; if one fails, those started are stopped by the caller (`stop()`)."""
        for replica in self.replicas:
            await replica.adapter.start()

    async def stop(self) -> None:
        for replica in self.replicas:
            await replica.adapter.stop()


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
