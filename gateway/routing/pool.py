"""The engine instances behind one model name, and the lease a request holds on one of them.

Concurrency rule: `acquire()` and `Lease.release()` run on the event loop only. Every acquired
lease is released exactly once (a second release is a no-op), whatever the request's outcome:
the error it ended with, if any, is passed to `release` so the replica's breaker sees it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from adapters.base import Adapter, Usage
from gateway.cache_routing.tracker import Placement, ReplicaCache
from gateway.routing.admission import Admission, Ticket
from gateway.routing.balancer import Candidate
from gateway.routing.health import Breaker, is_failure

KV_SATURATED = 0.95
"""KV-cache use at which an engine is treated as queueing (new work would wait or evict)."""


@dataclass(slots=True)
class Replica:
    """One engine instance: its adapter, its own admission (slots and queue) and its health."""

    adapter: Adapter
    admission: Admission
    name: str = "0"
    breaker: Breaker = field(default_factory=Breaker)
    engine_running: float | None = None
    """What its engine last reported (polled): running and waiting requests, KV-cache use 0..1."""
    engine_waiting: float | None = None
    kv_usage: float | None = None
    capacity_from: str = "engine default"
    """Where its slot count came from: user, launch, engine (reported), engine default, or none (no cap)."""
    served: int = 0
    failed: int = 0
    cache: ReplicaCache | None = None
    """What the cache-aware router tracks of its engine's cache (made on first use by `affinity: cache`)."""

    @property
    def outstanding(self) -> int:
        return self.admission.running + self.admission.waiting

    def down(self) -> bool:
        """Known not to serve now, without asking over the network (a supervised engine restarting)."""
        ready = self.adapter.ready_now()
        return ready is False

    def foreign_load(self) -> float:
        """The engine's own running + waiting count, for a shared upstream only (it has no incarnation): that
        also counts its other clients. An engine the gateway supervises serves the gateway alone, so its count,
        polled every few seconds, only lags the gateway's own: taken as load, it spilled conversations off the
        replica holding their prompts (the cache benchmark computed 1.8-1.9x the minimum instead of 1.4x)."""
        if self.adapter.incarnation() is not None:
            return 0.0
        return float((self.engine_running or 0) + (self.engine_waiting or 0))

    def candidate(self) -> Candidate:
        engine_queue = (self.engine_waiting or 0) > 0 or (self.kv_usage or 0) >= KV_SATURATED
        return Candidate(
            name=self.name,
            outstanding=self.outstanding,
            available=not self.down() and self.breaker.allows(),
            saturated=not self.admission.free or engine_queue,
            queueing=self.admission.waiting > 0 or engine_queue,
            engine_load=self.foreign_load(),
            probe=self.breaker.wants_probe(),
        )

    def status(self) -> dict[str, object]:
        """Its state for /v1/gateway/stats and the status page."""
        return {
            "name": self.name,
            "engine": self.adapter.engine,
            "state": self.breaker.state.value,
            "reason": self.breaker.reason,
            "down": self.down(),
            "running": self.admission.running,
            "waiting": self.admission.waiting,
            "slots": self.admission.concurrency,
            "slots_from": self.capacity_from,
            "max_queue": self.admission.max_queue,
            "engine_running": self.engine_running,
            "engine_waiting": self.engine_waiting,
            "kv_cache_usage_ratio": self.kv_usage,
            "served": self.served,
            "failed": self.failed,
            "breaker_opens": self.breaker.opens,
            **self._cache_status(),
            **{k: v for k, v in self.adapter.describe().items() if k in ("base_url", "port", "pid", "restarts")},
        }

    def _cache_status(self) -> dict[str, object]:
        cache = self.cache
        if cache is None:
            return {}
        c = cache.counts
        return {"prefix_index": {"blocks": len(cache.index), "capacity": cache.index.capacity, "predicted_right": c.right,
                                 "predicted_over": c.over, "predicted_under": c.under, "prompt_tokens": c.prompt_tokens,
                                 "cached_tokens": c.cached_tokens, "prefill_tokens_per_second": round(cache.prefill_rate.value, 1),
                                 "service_seconds": round(cache.service.value, 3), "slots": cache.slots is not None}}


@dataclass(frozen=True, slots=True)
class RouteKey:
    """What a request offers the balancer: a session key (header or `user`) and a hash of its prompt's prefix."""

    session: str | None = None
    prefix: str | None = None
    blocks: tuple[int, ...] = ()
    """Chained hashes of the whole prompt's text in fixed-size blocks (gateway/cache_routing/blocks.py):
    block i's hash covers blocks 0..i, so two prompts share a leading run exactly as long as their common prefix."""
    text: str = field(default="", compare=False)
    """The prompt's text that `blocks` cut (gateway/cache_routing/blocks.py: prompt_text)."""
    body: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)
    """The request itself, for a replica whose engine tells exactly what it holds (precise mode tokenizes it)."""
    path: str = ""


@dataclass(eq=False, slots=True)
class Lease:
    """A request's hold on one replica's slot, from admission to the end of its response."""

    replica: Replica
    reason: str = ""
    """Why the balancer chose this replica (a label of enginegate_routing_decisions)."""
    ticket: Ticket | None = None
    """Its admission's hold (flow, prefill budget)."""
    on_release: Callable[[], None] | None = None
    """The lifecycle's in-flight count for the model (it is not evicted while a lease is held)."""
    placement: Placement | None = None
    """The cache-aware router's prediction for this request here (checked against the engine's usage)."""
    slot: int | None = None
    """The engine slot it was sent to (`slot_field` in the body), when the router chose one."""
    released: bool = field(default=False, init=False)

    @property
    def adapter(self) -> Adapter:
        return self.replica.adapter

    def prefilled(self) -> None:
        """Its first token came (the prefill budget frees its prompt)."""
        if self.ticket is not None and not self.released:
            self.replica.admission.prefilled(self.ticket)
        if self.placement is not None and self.replica.cache is not None:
            self.replica.cache.first_token(self.placement)

    def pin(self) -> None:
        """Its stream can no longer be resumed: the scheduler must not preempt it."""
        if self.ticket is not None and not self.released:
            self.replica.admission.pin(self.ticket)

    def report(self, usage: Usage | None) -> None:
        """The engine's usage for the request: what it reused of the prompt corrects the router's index."""
        if self.placement is not None and self.replica.cache is not None:
            self.replica.cache.report(self.placement, usage)

    def release(self, error: BaseException | None = None) -> None:
        if self.released:
            return
        self.released = True
        replica = self.replica
        replica.admission.release(self.ticket)
        if self.placement is not None and replica.cache is not None:
            replica.cache.end(self.placement)
        replica.breaker.record(error, replica.adapter.incarnation())
        if error is None:
            replica.served += 1
        elif is_failure(error):
            replica.failed += 1
        if self.on_release is not None:
            self.on_release()
