"""The engine instances behind one model name, and the lease a request holds on one of them.

Concurrency rule: `acquire()` and `Lease.release()` run on the event loop only. Every acquired
lease is released exactly once (a second release is a no-op), whatever the request's outcome:
the error it ended with, if any, is passed to `release` so health tracking can see it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from adapters.base import Adapter
from gateway.routing.admission import Admission


@dataclass(slots=True)
class Replica:
    """One engine instance: its adapter and its own admission (slots and queue)."""

    adapter: Adapter
    admission: Admission
    name: str = "0"


@dataclass(frozen=True, slots=True)
class RouteKey:
    """What a request offers the balancer: a session key (header or `user`) and a hash of its prompt's prefix."""

    session: str | None = None
    prefix: str | None = None


@dataclass(eq=False, slots=True)
class Lease:
    """A request's hold on one replica's slot, from admission to the end of its response."""

    replica: Replica
    on_release: Callable[[], None] | None = None
    """The lifecycle's in-flight count for the model (it is not evicted while a lease is held)."""
    released: bool = field(default=False, init=False)

    @property
    def adapter(self) -> Adapter:
        return self.replica.adapter

    def release(self, error: BaseException | None = None) -> None:
        if self.released:
            return
        self.released = True
        self.replica.admission.release()
        if self.on_release is not None:
            self.on_release()
