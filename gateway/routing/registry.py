"""Model id -> the backend that serves it."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from adapters.base import Adapter, EngineStats, Health
from gateway.config import RoutingConfig
from gateway.planning import Plan
from gateway.cache_routing.cost import Place, estimate
from gateway.cache_routing.peering import PeerFeed
from gateway.cache_routing.peers import Note, addressed, shared_name
from gateway.cache_routing.precise import PreciseCache
from gateway.cache_routing.tracker import Placement, ReplicaCache
from gateway.lora import routing as lora_routing
from gateway.routing import capacity
from gateway.routing.admission import Admission
from gateway.routing.balancer import Balancer
from gateway.routing.health import BreakerState
from gateway.routing.monitor import HealthMonitor, follow_capacity
from gateway.routing.pool import Lease, Replica, RouteKey
from gateway.scheduling import Demand

if TYPE_CHECKING:
    from gateway.routing.lifecycle import EngineChoice, Lifecycles, ModelLifecycle

log = logging.getLogger("enginegate.routing")


@dataclass(slots=True)
class Backend:
    """One served model name. `adapter` and `admission` are its first replica's; requests go through `acquire`.

    Concurrency rule: `acquire` runs on the event loop; between the balancer's choice and the
    replica's admission there is no await, so concurrent requests see each other's load.
    """

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
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    parent: str | None = None
    """For a LoRA adapter served as a model of its own: the base model's id. Such a backend shares the base's
    replicas, admission and lifecycle (one engine serves both); its own name keys access, usage and metrics."""
    children: list[Backend] = field(default_factory=list)
    """The base's adapters' backends, which follow it to a fallback engine (`use`)."""
    balancer: Balancer = field(init=False)
    monitor: HealthMonitor | None = field(default=None, init=False)
    peers: PeerFeed | None = field(default=None, init=False)
    """The placement notes shared with other gateways in front of the same replicas (`routing.cache_peers`)."""

    def __post_init__(self) -> None:
        if not self.replicas:
            self.replicas = [Replica(self.adapter, self.admission)]
        self.balancer = Balancer(self.routing.balance, self.routing.affinity, self.routing.load_factor)

    @property
    def engine(self) -> str:
        return self.adapter.engine

    @property
    def running(self) -> int:
        return sum(r.admission.running for r in self.replicas)

    @property
    def preempts(self) -> bool:
        """Some replica lends kept slots to streams it may preempt (`scheduler.preempt`)."""
        return any(r.admission.preempts for r in self.replicas)

    @property
    def waiting(self) -> int:
        return sum(r.admission.waiting for r in self.replicas)

    @property
    def slots(self) -> int | None:
        """Generations at once over all replicas; None: at least one has no gateway cap."""
        counts = [r.admission.concurrency for r in self.replicas]
        return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)

    @property
    def max_queue(self) -> int:
        return sum(r.admission.max_queue for r in self.replicas)

    async def health(self) -> Health:
        """Ready when any replica serves (its engine ready and its breaker not open); the detail names each."""
        if len(self.replicas) == 1:
            return await self.adapter.health()
        checks = await asyncio.gather(*(r.adapter.health() for r in self.replicas))
        up = [h.ready and r.breaker.state is not BreakerState.OPEN for r, h in zip(self.replicas, checks, strict=True)]
        parts = [f"replica {r.name}: {'up' if ok else 'down'} ({h.detail or r.breaker.reason or r.breaker.state.value})"
                 for r, h, ok in zip(self.replicas, checks, up, strict=True)]
        return Health(any(up), f"{sum(up)}/{len(up)} replicas up; " + "; ".join(parts))

    async def engine_stats(self) -> EngineStats | None:
        """The engines' own stats over all replicas: counts and counters summed, KV-cache use the highest."""
        if len(self.replicas) == 1:
            return await self.adapter.engine_stats()
        found = [s for s in await asyncio.gather(*(r.adapter.engine_stats() for r in self.replicas)) if s is not None]
        if not found:
            return None
        total = EngineStats()
        for name in (f.name for f in dataclasses.fields(EngineStats)):
            values = [getattr(s, name) for s in found if getattr(s, name) is not None]
            if values:
                setattr(total, name, max(values) if name == "kv_cache_usage_ratio" else sum(values))
        return total

    def route_key(self, route: RouteKey | None) -> str | None:
        """The affinity key this backend routes on (None: balance by load alone, or by cost)."""
        if route is None or self.routing.affinity in ("none", "cache"):
            return None
        return route.session if self.routing.affinity == "session" else route.prefix

    @property
    def routes_by_cache(self) -> bool:
        """Requests carry their prompt's blocks: `affinity: cache` over several replicas, or over one
        whose slots the router picks."""
        if self.routing.affinity != "cache" or not self.replicas:
            return False
        return len(self.replicas) > 1 or self.pinned_slots(self.replicas[0]) is not None

    def pinned_slots(self, replica: Replica) -> int | None:
        """How many engine slots the router addresses on this replica (`slot_field`), or None: the
        engine chooses. Only where the gateway admits exactly as many requests as the engine has slots,
        so the slot it picks is always free, and where the engine's spec says it pays (`slots_pay`)."""
        spec = getattr(replica.adapter, "spec", None)
        options = getattr(replica.adapter, "options", {})
        if not self.routing.pin_slots or getattr(spec, "slot_field", None) is None:
            return None
        if spec.slots_pay is not None and not spec.slots_pay(options):
            return None
        slots = capacity.engine_limit(replica.adapter.engine, options)
        return slots if slots is not None and slots == replica.admission.concurrency else None

    def cache_of(self, replica: Replica) -> ReplicaCache:
        if replica.cache is None:
            replica.cache = ReplicaCache(self.routing.index_blocks, self.routing.block_chars, self.pinned_slots(replica),
                                         precise_view(replica.adapter))
        replica.cache.follow(replica.adapter.incarnation())
        return replica.cache

    async def _precise(self, route: RouteKey) -> tuple[list[int | None], int | None]:
        """What each replica's engine says it holds of the prompt, where it tells (None elsewhere), and
        the prompt's length in tokens: one replica tokenizes it (replicas of one model tokenize alike)."""
        views = [self.cache_of(r).precise for r in self.replicas]
        answering = [v for v in views if v is not None and v.answering]
        if route.body is None or not answering:
            return [None] * len(views), None
        try:
            tokens = await answering[0].tokens(route.body, route.path)
        except Exception as exc:  # a view that fails is no view: the approximate index decides
            log.warning("%s: the precise cache view failed: %s", self.model_id, exc)
            tokens = None
        if tokens is None:
            return [None] * len(views), None
        return [v.matched(tokens) if v is not None else None for v in views], len(tokens)

    async def acquire(self, route: RouteKey | None = None, exclude: Collection[Replica] = (),
                      demand: Demand | None = None) -> Lease:
        """Make sure the model is loaded (the lifecycle: ModelUnavailable when it cannot be now), then
        wait for a slot on a replica that can serve the request (QueueFull when none can take it;
        DeadlineExceeded when its deadline passes while it waits).

        `exclude`: replicas this request already failed on (a retry goes elsewhere while it can);
        `demand`: what the scheduler orders it by (flow, tier, weight, prompt, deadline)."""
        done = None
        if self.lifecycle is not None and self.lifecycles is not None:
            done = await self.lifecycles.acquire(self.lifecycle)
        try:
            lease = await self._lease(route, exclude, demand)
        except BaseException:
            if done is not None:
                done()
            raise
        lease.on_release = done
        return lease

    def use(self, choice: EngineChoice) -> None:
        """Serve with another engine (the lifecycle's fallback): its replicas replace the current ones."""
        self.replicas = choice.build()
        self.adapter, self.admission = self.replicas[0].adapter, self.replicas[0].admission
        self.plan = choice.plan
        for child in self.children:
            child.replicas, child.adapter, child.admission, child.plan = self.replicas, self.adapter, self.admission, self.plan

    async def _lease(self, route: RouteKey | None, exclude: Collection[Replica], demand: Demand | None) -> Lease:
        """The replica's choice and its admission (see acquire)."""
        key = self.route_key(route)
        by_cache = route is not None and bool(route.text)  # request_route gives a text only to cache routing
        precise, prompt_tokens = await self._precise(route) if by_cache and route is not None else ([], None)
        placement: Placement | None = None
        for attempt in range(len(self.replicas) + 1):
            pool = self.replicas
            candidates = [r.candidate() for r in pool]
            if exclude:  # a retry: the replicas it failed on count as down (a keyed request fails over)
                candidates = [dataclasses.replace(c, available=False, probe=False) if r in exclude else c
                              for r, c in zip(pool, candidates, strict=True)]
            places: list[Place] | None = None
            placements: list[Placement] = []
            if by_cache and route is not None:
                found = [self.cache_of(r).place(route.blocks, route.text, c.outstanding, c.engine_load,
                                                r.admission.concurrency, precise[i] if i < len(precise) else None,
                                                prompt_tokens)
                         for i, (r, c) in enumerate(zip(pool, candidates, strict=True))]
                places, placements = [f[0] for f in found], [f[1] for f in found]
            choice = self.balancer.choose(candidates, key, places)
            assert choice is not None
            if places is not None and log.isEnabledFor(logging.DEBUG):
                log.debug("%s: %s to replica %s; per replica (outstanding, matched, prompt tokens, wait s, prefill s, "
                          "eviction s): %s", self.model_id, choice.reason, pool[choice.index].name,
                          [(p.outstanding, round(p.matched_tokens), round(p.prompt_tokens), *(round(x, 2) for x in
                            (e.wait_seconds, e.prefill_seconds, e.eviction_seconds))) for p, e in
                           ((p, estimate(p)) for p in places)])
            replica, reason = pool[choice.index], choice.reason
            if self.parent is not None and len(pool) > 1:  # a LoRA adapter: where it is loaded (gateway/lora/routing.py)
                index, why = lora_routing.choose([lora_routing.AdapterPlace(
                    c.outstanding, r.admission.concurrency, self.model_id in loaded_loras(r.adapter), c.available)
                    for r, c in zip(pool, candidates, strict=True)], choice.index)
                if why is not None:
                    replica, reason = pool[index], why
            if replica.admission.full:
                replica = self._roomier(pool, replica)
                if replica is not pool[choice.index] and reason in ("affinity", "cache_hit"):
                    reason = "affinity_spill" if reason == "affinity" else "cache_load"
            placement = placements[pool.index(replica)] if placements else None
            if placement is not None and replica.cache is not None:  # made by place() above
                replica.cache.chosen(placement)
                self._tell_peers(replica, placement)
            probe = replica.breaker.dispatched()  # before any wait: one trial request at a time
            try:
                ticket = await replica.admission.acquire(demand)
            except BaseException:
                replica.breaker.undispatched(probe)
                raise
            if attempt < len(self.replicas) and replica.down() and any(not r.down() for r in pool):
                replica.breaker.undispatched(probe)
                replica.admission.release(ticket)  # it died while we waited for its slot: choose again
                continue
            break
        lease = Lease(replica, reason, ticket, placement=placement)
        if placement is not None and replica.cache is not None:
            lease.slot = replica.cache.dispatch(placement)
        return lease

    def _tell_peers(self, replica: Replica, placement: Placement) -> None:
        if self.peers is not None:
            name = shared_name(replica.adapter.describe(), replica.adapter.incarnation())
            if name is not None:
                self.peers.publish(name, placement.blocks)

    def _placed_by_peer(self, note: Note) -> bool:
        """Another gateway's placement: into this gateway's index of that replica (False: not one of ours)."""
        names = [shared_name(r.adapter.describe(), r.adapter.incarnation()) for r in self.replicas]
        i = addressed(note, names)
        if i is None:
            return False
        self.cache_of(self.replicas[i]).placed_by_peer(note.blocks)
        return True

    @staticmethod
    def _roomier(pool: list[Replica], chosen: Replica) -> Replica:
        """The chosen replica's queue is full: any usable replica with room, before refusing with 429."""
        for replica in pool:
            if not replica.admission.full and not replica.down():
                return replica
        return chosen

    async def start(self) -> None:
        results = await asyncio.gather(*(r.adapter.start() for r in self.replicas), return_exceptions=True)
        failures = [(r, e) for r, e in zip(self.replicas, results, strict=True) if isinstance(e, BaseException)]
        if len(failures) == len(self.replicas) or any(not isinstance(e, Exception) for _, e in failures):
            raise failures[0][1]
        for replica, error in failures:  # the others serve; the monitor watches for this one's readiness
            log.warning("%s replica %s did not start: %s", self.model_id, replica.name, error)
            replica.breaker.readiness(False, str(getattr(error, "message", error)))
        await asyncio.gather(*(follow_capacity(r) for r in self.replicas))
        if self.routes_by_cache:  # a model that does not route by cache gets no cache state at all
            for replica in self.replicas:
                view = self.cache_of(replica).precise
                if view is not None:
                    await view.start()
            if self.routing.cache_peers and self.peers is None:
                self.peers = PeerFeed(self.routing.cache_peers, f"enginegate:cache-peers:{self.model_id}",
                                      self._placed_by_peer, self.routing.block_chars)
                await self.peers.start()
        if len(self.replicas) > 1 and self.monitor is None:
            self.monitor = HealthMonitor(self.replicas, self.routing.health_interval_seconds)
            self.monitor.start()

    async def stop(self) -> None:
        if self.peers is not None:
            await self.peers.stop()
            self.peers = None
        for replica in self.replicas:
            if replica.cache is not None and replica.cache.precise is not None:
                await replica.cache.precise.stop()
        if self.monitor is not None:
            await self.monitor.stop()
            self.monitor = None
        results = await asyncio.gather(*(r.adapter.stop() for r in self.replicas), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result


def loaded_loras(adapter: Adapter) -> frozenset[str]:
    """The LoRA adapters this engine instance has loaded now (its own report; none where it reports none)."""
    report = getattr(adapter, "loaded_loras", None)
    return report() if callable(report) else frozenset()


def precise_view(adapter: Adapter) -> PreciseCache | None:
    """The engine's own record of its KV blocks, where it publishes one (vLLM with `kv_events: true`).
    Imported only then: the plain gateway does not need pyzmq."""
    options = getattr(adapter, "options", None)
    if adapter.engine != "vllm" or not isinstance(options, Mapping) or options.get("kv_events") is not True:
        return None
    from gateway.cache_routing.kv_events import KvEventsCache

    return KvEventsCache.for_adapter(adapter)


class ModelRegistry:
    def __init__(self) -> None:
        self._backends: dict[str, Backend] = {}
        self._by_name: dict[str, Backend] = {}
        self._adapters: dict[str, Backend] = {}

    def add(self, backend: Backend) -> None:
        for name in (backend.model_id, *backend.aliases):
            if name in self._by_name:
                raise ValueError(f"model id {name!r} is configured twice")
            self._by_name[name] = backend
        self._backends[backend.model_id] = backend

    def add_adapter(self, adapter: Backend, base: Backend) -> None:
        """A LoRA adapter's backend: found by its name, listed by `adapters()`, never started or stopped
        itself (iteration yields the bases, which own the engines)."""
        if adapter.model_id in self._by_name:
            raise ValueError(f"model id {adapter.model_id!r} is configured twice")
        self._by_name[adapter.model_id] = adapter
        self._adapters[adapter.model_id] = adapter
        base.children.append(adapter)

    def adapters(self) -> Iterator[Backend]:
        return iter(self._adapters.values())

    def served(self) -> Iterator[Backend]:
        """Every model a client may name: the bases, then the adapters."""
        yield from self._backends.values()
        yield from self._adapters.values()

    def get(self, name: str) -> Backend | None:
        return self._by_name.get(name)

    def __iter__(self) -> Iterator[Backend]:
        return iter(self._backends.values())

    def __len__(self) -> int:
        return len(self._backends)

    def known(self, name: str) -> bool:
        return name in self._by_name
