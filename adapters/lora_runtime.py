"""LoRA adapters loaded by the gateway at run time: the one place that calls the engine's load and unload
endpoints (vLLM's /v1/load_lora_adapter, SGLang's /load_lora_adapter), deciding by adapters/lora_eviction.py.

Concurrency rule: the state below is changed only between awaits, on the event loop. A request `acquire`s
its adapter before it is sent and `release`s it when its answer (or stream) ends; an adapter some request
holds is never unloaded. A load runs in a task of its own, so a client that leaves while its adapter loads
cancels only its own wait, never the load others wait for. Two first requests for one adapter share one
load; if it fails, each gets the error (the adapter named, its path only in the log), and the next request
tries again; the base model and the other adapters are not affected. When the engine restarts (a new
incarnation) nothing is loaded any more, so the record starts empty."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Protocol

from adapters.base import EngineError, StreamEvent
from adapters.lora import LoraAdapter
from adapters.lora_eviction import Held, decide

log = logging.getLogger(__name__)


class LoraEngine(Protocol):
    async def load_lora(self, adapter: LoraAdapter) -> None:
        """Load it (an adapter the engine has already is loaded); raise EngineError when the engine refuses."""
        ...

    async def unload_lora(self, name: str) -> None:
        """Unload it (one the engine does not have is unloaded)."""
        ...


@dataclass(slots=True)
class _Load:
    done: asyncio.Future[None]
    waiters: int = 0
    """Requests that wait for this load and hold the adapter once it is loaded."""


@dataclass(slots=True)
class Counts:
    loads: int = 0
    unloads: int = 0
    failures: int = 0


@dataclass
class RuntimeLoras:
    engine: LoraEngine
    adapters: tuple[LoraAdapter, ...]
    capacity: int
    wait: float = 60.0
    """Seconds a request waits for a place when every loaded adapter is in use, before a 503."""
    counts: Counts = field(default_factory=Counts)
    _held: dict[str, Held] = field(default_factory=dict)
    _loading: dict[str, _Load] = field(default_factory=dict)
    _unloading: dict[str, asyncio.Future[None]] = field(default_factory=dict)
    _tick: int = 0
    _incarnation: object = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def loaded(self, incarnation: object = None) -> frozenset[str]:
        """What is loaded (in the engine `incarnation`, when given: none in one the record has not seen)."""
        if incarnation is not None and incarnation != self._incarnation:
            return frozenset()
        return frozenset(self._held)

    def in_flight(self, name: str) -> int:
        held = self._held.get(name)
        return held.in_flight if held is not None else 0

    def _next(self) -> int:
        self._tick += 1
        return self._tick

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def acquire(self, name: str, incarnation: object) -> None:
        """Return once `name` is loaded and held by this request (release it when the answer ends)."""
        path = {a.name: a for a in self.adapters}
        if name not in path:
            raise KeyError(name)
        if incarnation != self._incarnation:  # a new engine process has none of the old one's adapters
            self._incarnation = incarnation
            self._held.clear()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait
        while True:
            unloading = self._unloading.get(name)
            if unloading is not None:  # evicted a moment ago: its unload first, then load it again
                await asyncio.shield(unloading)
                continue
            decision = decide(name, self._held, frozenset(self._loading), self.capacity)
            if decision.action == "use":
                held = self._held[name]
                self._held[name] = Held(self._next(), held.in_flight + 1)
                return
            if decision.action == "wait":
                left = deadline - loop.time()
                if left <= 0:
                    raise EngineError(f"LoRA adapter `{name}`: all {self.capacity} adapter places of its engine "
                                      f"are held by requests in flight", 503, "adapter_slots_full")
                changed = self._changed
                try:
                    await asyncio.wait_for(changed.wait(), left)
                except TimeoutError:
                    pass
                continue
            if decision.action == "load":
                load = self._loading[name] = _Load(loop.create_future())
                if decision.evict is not None:
                    self._held.pop(decision.evict)
                    self._unloading[decision.evict] = loop.create_future()
                task = loop.create_task(self._load(path[name], decision.evict, load))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            load = self._loading[name]
            load.waiters += 1
            try:
                await asyncio.shield(load.done)
            except asyncio.CancelledError:
                if load.done.done() and not load.done.cancelled() and load.done.exception() is None:
                    self.release(name)  # it loaded (held for us) as we left
                else:
                    load.waiters -= 1
                raise
            return  # loaded, and held for each waiter (see _load)

    async def _load(self, adapter: LoraAdapter, evict: str | None, load: _Load) -> None:
        try:
            if evict is not None:
                try:
                    await self.engine.unload_lora(evict)
                    self.counts.unloads += 1
                    log.info("LoRA adapter %s unloaded (least recently used) for %s", evict, adapter.name)
                except Exception as exc:  # noqa: BLE001 - its place is given up either way; say so
                    log.warning("LoRA adapter %s: unload failed (%s); loading %s in its place", evict, exc,
                                adapter.name)
                finally:
                    done = self._unloading.pop(evict)
                    done.set_result(None)
            await self.engine.load_lora(adapter)
        except Exception as exc:  # noqa: BLE001 - handed to every request that waits for this load
            self.counts.failures += 1
            log.error("LoRA adapter %s (%s) could not be loaded: %s", adapter.name, adapter.path, exc)
            error = EngineError(f"LoRA adapter `{adapter.name}` could not be loaded on its engine (the gateway's "
                                f"log says why)", 503, "adapter_load_failed")
            load.done.set_exception(error)
            load.done.exception()  # retrieved: a load nobody waits for any more is not an unhandled error
        else:
            self.counts.loads += 1
            self._held[adapter.name] = Held(self._next(), load.waiters)
            load.done.set_result(None)
        finally:
            del self._loading[adapter.name]
            self._notify()

    def release(self, name: str) -> None:
        held = self._held.get(name)
        if held is not None and held.in_flight > 0:
            self._held[name] = Held(held.last_used, held.in_flight - 1)
            self._notify()


async def released_at_end(events: AsyncIterator[StreamEvent], release: Callable[[], None]) -> AsyncIterator[StreamEvent]:
    """The stream, with its adapter released when it ends, fails or is closed (the client gone)."""
    try:
        async for event in events:
            yield event
    finally:
        release()
        close = getattr(events, "aclose", None)
        if close is not None:
            await close()
