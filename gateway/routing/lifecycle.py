"""Which models are loaded: load on demand, the memory budget, eviction, fallback, ttl.

The one place that starts, stops and evicts engines. Each served model has a `ModelLifecycle`
(its state: unloaded -> loading -> loaded -> unloading -> unloaded, or failed); one `Lifecycles`
holds them all with the budget and makes every decision.

Concurrency rules (all on the event loop):
- A decision and the state changes it implies (the model to load marked LOADING, its victims
  UNLOADING) happen in one synchronous step, so two requests never both see free memory.
- Loads run one at a time (`_load_lock`): an in-process engine's footprint is the gateway's RSS
  growth across its load, which a concurrent load would blur. A load is a task of its own: the
  request that started it may give up (timeout, disconnect) without cancelling it.
- A model is evicted only when nothing runs or waits on it (`in_flight == 0`). When memory is
  held by a busy model, the waiting request drains it: no new request is admitted to it, its
  running requests finish, then it is evicted (the anti-thrash rule's first half).
- A model just swapped in is protected until it has admitted the requests that waited for its
  load, up to `swap_batch` of them (the fairness bound: the second half), so two models
  alternating requests swap once per batch, not once per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from adapters.base import EngineError
from adapters.server import ServerAdapter
from gateway.routing import budget, footprint
from gateway.routing.budget import Charges, Fit, Refuse, Resident, Wait
from gateway.tracing import spans
from gateway.tracing import switch as tracing

if TYPE_CHECKING:
    from gateway.planning import Plan
    from gateway.routing.pool import Replica
    from gateway.routing.registry import Backend

log = logging.getLogger("enginegate.lifecycle")
FAILED_RETRY_SECONDS = 30.0
"""A model whose every engine failed to load answers 503 this long before a request tries again."""
TTL_CHECK_SECONDS = 1.0
"""How often idle models are checked for their ttl, and loaded ones for an engine that gave up."""
MAX_LISTED_FAILURES = 10


class State(enum.StrEnum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    UNLOADING = "unloading"
    FAILED = "failed"


class ModelUnavailable(Exception):
    """The model cannot serve this request now: 503 with Retry-After and the reason."""

    def __init__(self, reason: str, retry_after: float, code: str = "model_unavailable") -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = max(1, round(retry_after))
        self.code = code


@dataclass(slots=True)
class EngineChoice:
    """One ranked way to serve a model: an engine, its plan, and how to build its replicas."""

    engine: str
    plan: Plan | None
    build: Callable[[], list[Replica]]
    charges: Charges = field(default_factory=dict)
    """Pool -> bytes this engine is expected to hold (its plan's figure)."""
    because: str = ""


@dataclass(frozen=True, slots=True)
class LoadFailure:
    engine: str
    reason: str
    at: float


class Observer(Protocol):
    """What the lifecycle reports (GatewayMetrics implements it)."""

    def model_loaded(self, model: str, engine: str, seconds: float) -> None: ...
    def model_load_failed(self, model: str, engine: str, fallback_to: str | None) -> None: ...
    def model_evicted(self, model: str, reason: str) -> None: ...
    def model_load_wait(self, model: str, seconds: float) -> None: ...
    def model_footprint(self, model: str, estimated: int, measured: int | None) -> None: ...


class _Silent:
    def model_loaded(self, model: str, engine: str, seconds: float) -> None: ...
    def model_load_failed(self, model: str, engine: str, fallback_to: str | None) -> None: ...
    def model_evicted(self, model: str, reason: str) -> None: ...
    def model_load_wait(self, model: str, seconds: float) -> None: ...
    def model_footprint(self, model: str, estimated: int, measured: int | None) -> None: ...


@dataclass(eq=False)
class ModelLifecycle:
    backend: Backend
    estimate: Charges
    """Pool -> bytes the plan expects (replaced by `measured` once loaded)."""
    choices: list[EngineChoice] = field(default_factory=list)
    pinned: bool = False
    preload: bool = False
    ttl_seconds: float | None = None
    state: State = State.UNLOADED
    reason: str = ""
    measured: dict[str, int] | None = None
    failures: list[LoadFailure] = field(default_factory=list)
    active: int = 0
    """The choice in use (or to try first)."""
    in_flight: int = 0
    wanting: int = 0
    draining: bool = False
    """Admits nothing new while another model waits for its memory (cleared when none waits any more)."""
    unload_asked: bool = False
    """An unload (admin) waits for the running requests: admits nothing new until it is done or gave up."""
    last_used: float = 0.0
    loaded_at: float | None = None
    failed_at: float | None = None
    load_seconds: float | None = None
    loads: int = 0
    quota: int = 0
    admitted: int = 0

    @property
    def name(self) -> str:
        return self.backend.model_id

    @property
    def charges(self) -> Charges:
        return {**self.estimate, **self.measured} if self.measured else self.estimate

    @property
    def resident(self) -> bool:
        return self.state in (State.LOADING, State.LOADED, State.UNLOADING)

    @property
    def protected(self) -> bool:
        return self.state is State.LOADED and not self.draining and self.admitted < self.quota and self.wanting > 0

    def footprint_note(self) -> str | None:
        """Where estimate and measurement differ by more than 20 %."""
        if not self.measured:
            return None
        notes = [f"{pool}: estimated {budget.gib(self.estimate.get(pool, 0))}, measured {budget.gib(used)}"
                 for pool, used in self.measured.items() if budget.differs(self.estimate.get(pool, 0), used)]
        return "; ".join(notes) or None

    def engine_reason(self) -> str:
        """Which engine serves and why: the plan's (or the config's) choice, or a fallback and what failed."""
        if not self.choices:
            return "set in the model's config"
        choice = self.choices[self.active]
        if self.active == 0:
            return choice.because
        preferred = self.choices[0].engine
        failed = next((f.reason for f in reversed(self.failures) if f.engine == preferred), "")
        return (f"fallback: {preferred} failed to load ({failed}); {choice.engine} is the {choice.because}; "
                f"the next load tries {preferred} again")

    def view(self) -> dict[str, Any]:
        """The model's state for /v1/models, /v1/gateway/plan and the status page."""
        return {
            "state": self.state.value,
            **({"reason": self.reason} if self.reason else {}),
            "engine": self.choices[self.active].engine if self.choices else self.backend.engine,
            "engine_reason": self.engine_reason(),
            "pinned": self.pinned,
            "preload": self.preload,
            "ttl_seconds": self.ttl_seconds,
            "footprint": {"estimated_bytes": dict(self.estimate), "measured_bytes": self.measured,
                          "differs": self.footprint_note()},
            "load_seconds": self.load_seconds,
            "loads": self.loads,
            "in_flight": self.in_flight,
            "waiting_for_load": self.wanting,
            "unload_asked": self.unload_asked,
            "fallbacks": [{"engine": f.engine, "reason": f.reason} for f in self.failures[-MAX_LISTED_FAILURES:]],
        }


class Lifecycles:
    def __init__(self, capacity: Charges, *, load_timeout: float = 300.0, swap_batch: int = 16,
                 observer: Observer | None = None) -> None:
        self.capacity = dict(capacity)
        self.load_timeout = load_timeout
        self.swap_batch = swap_batch
        self.observer: Observer = observer or _Silent()
        self.models: dict[str, ModelLifecycle] = {}
        self._changed = asyncio.Event()
        self._load_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ttl_task: asyncio.Task[None] | None = None

    def add(self, lc: ModelLifecycle) -> None:
        self.models[lc.name] = lc
        lc.backend.lifecycle = lc
        lc.backend.lifecycles = self

    def __iter__(self) -> Iterator[ModelLifecycle]:
        return iter(self.models.values())

    # -- start-up checks --------------------------------------------------------------------

    def config_errors(self) -> list[str]:
        """What can never work with this budget: a model that cannot fit alone, pinned models that cannot fit together."""
        errors = []
        for lc in self:
            why = budget.never_fits(lc.estimate, self.capacity)
            if why:
                errors.append(f"model {lc.name!r} can never be loaded: it {why} (lower its context_length, "
                              "or raise memory_budget)")
        overflow = budget.pinned_overflow({lc.name: lc.estimate for lc in self if lc.pinned}, self.capacity)
        if overflow:
            errors.append(overflow + " (pin fewer models, or raise memory_budget)")
        return errors

    # -- what a request does ------------------------------------------------------------------

    async def acquire(self, lc: ModelLifecycle) -> Callable[[], None]:
        """Return once `lc` is loaded and counts this request in flight; call the result when it ends."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self.load_timeout
        waited_on = ""
        lc.wanting += 1
        try:
            while True:
                if lc.state is State.LOADED and lc.draining and not self._memory_wanted(lc):
                    lc.draining = False  # whoever needed its memory gave up or was served elsewhere
                if lc.state is State.LOADED and not lc.draining and not lc.unload_asked:
                    lc.in_flight += 1
                    lc.admitted += 1
                    lc.last_used = time.monotonic()
                    if loop.time() - started > 0.001:
                        self.observer.model_load_wait(lc.name, loop.time() - started)
                    return lambda: self._release(lc)
                if lc.state is State.FAILED:
                    assert lc.failed_at is not None
                    left = lc.failed_at + FAILED_RETRY_SECONDS - time.monotonic()
                    if left > 0:
                        raise ModelUnavailable(f"model {lc.name!r} failed to load: {lc.reason}", left, "model_load_failed")
                if lc.state in (State.UNLOADED, State.FAILED):
                    waited_on = self._try_load(lc)
                left = deadline - loop.time()
                if left <= 0:
                    raise ModelUnavailable(
                        f"model {lc.name!r} is not loaded after {self.load_timeout:g} s (load_timeout_seconds): "
                        f"{waited_on or lc.state.value}", min(self.load_timeout, 30.0), "model_load_timeout")
                await self._wait_changed(left)
        finally:
            lc.wanting -= 1

    def _memory_wanted(self, lc: ModelLifecycle) -> bool:
        return any(o.wanting > 0 and not o.resident for o in self if o is not lc)

    def _release(self, lc: ModelLifecycle) -> None:
        lc.in_flight -= 1
        lc.last_used = time.monotonic()
        self._notify()

    def _residents(self) -> list[Resident]:
        return [
            Resident(lc.name, lc.charges, lc.last_used, lc.pinned,
                     busy=lc.in_flight > 0 or lc.state is not State.LOADED or lc.wanting > 0 and not lc.draining,
                     protected=lc.protected)
            for lc in self if lc.resident
        ]

    def _try_load(self, lc: ModelLifecycle) -> str:
        """Decide now and act: start the load (evicting first), drain busy models, or refuse. Returns what it waits on."""
        decision = budget.decide(lc.name, lc.charges, self.capacity, self._residents())
        match decision:
            case Fit(evict=evict):
                victims = [self.models[n] for n in evict]
                for v in victims:
                    v.state = State.UNLOADING
                lc.state, lc.reason = State.LOADING, ""
                self._spawn(self._evict_then_load(lc, victims))
                return "loading"
            case Wait(reason=reason, drain=drain):
                for name in drain:
                    self.models[name].draining = True
                return reason
            case Refuse(reason=reason):
                raise ModelUnavailable(reason, 30.0, "model_memory_busy")
        raise AssertionError(decision)

    # -- loading, unloading --------------------------------------------------------------------

    async def _evict_then_load(self, lc: ModelLifecycle, victims: Sequence[ModelLifecycle]) -> None:
        try:
            for v in victims:
                try:
                    await self._stop(v, "budget")
                except Exception as exc:  # its engine did not stop cleanly: it is marked unloaded all the same
                    log.warning("model %s: unloading it raised %s", v.name, exc)
            await self._load(lc)
        except Exception as exc:
            log.exception("loading %s failed", lc.name)
            lc.state, lc.reason, lc.failed_at = State.FAILED, f"{type(exc).__name__}: {exc}", time.monotonic()
        finally:
            if lc.state is State.LOADING:  # cancelled (shutdown): never left half-way
                lc.state = State.UNLOADED
            self._notify()

    async def _load(self, lc: ModelLifecycle) -> None:
        async with self._load_lock, _load_span(lc.name):
            order = list(range(len(lc.choices))) or [0]  # every load tries the preferred engine first
            for position, index in enumerate(order):
                choice = lc.choices[index] if lc.choices else None
                if choice is not None and index != lc.active:
                    lc.backend.use(choice)
                    lc.estimate, lc.measured = choice.charges or lc.estimate, None
                lc.active = index
                engine = choice.engine if choice else lc.backend.engine
                rss_before = footprint.own_rss()
                started = time.perf_counter()
                try:
                    async with _start_span(lc.name, engine):
                        await lc.backend.start()
                except (EngineError, OSError, RuntimeError, ValueError) as exc:
                    reason = exc.message if isinstance(exc, EngineError) else f"{type(exc).__name__}: {exc}"
                    await self._quiet_stop(lc)
                    nxt = lc.choices[order[position + 1]].engine if position + 1 < len(order) else None
                    lc.failures.append(LoadFailure(engine, reason, time.time()))
                    self.observer.model_load_failed(lc.name, engine, nxt)
                    log.warning("model %s: %s failed to load (%s)%s", lc.name, engine, reason,
                                f"; trying {nxt}" if nxt else "")
                    continue
                except BaseException:
                    await self._quiet_stop(lc)
                    lc.state, lc.reason = State.UNLOADED, "load cancelled"
                    raise
                lc.load_seconds = time.perf_counter() - started
                lc.state, lc.reason = State.LOADED, ""
                self._measure(lc, rss_before)
                lc.loads += 1
                lc.loaded_at = lc.last_used = time.monotonic()
                lc.draining = False
                lc.admitted, lc.quota = 0, min(max(lc.wanting, 1), self.swap_batch)
                self.observer.model_loaded(lc.name, engine, lc.load_seconds)
                log.info("model %s loaded with %s in %.2f s", lc.name, engine, lc.load_seconds)
                return
            lc.state, lc.failed_at = State.FAILED, time.monotonic()
            lc.reason = "; ".join(f"{f.engine}: {f.reason}" for f in lc.failures[-len(order):])
            if lc.choices and lc.active != 0:
                lc.backend.use(lc.choices[0])  # the next try starts again from the plan's first choice
                lc.estimate = lc.choices[0].charges or lc.estimate
            lc.active = 0

    def _measure(self, lc: ModelLifecycle, rss_before: int) -> None:
        """Replace the estimate by a measurement: an engine server's process groups, measured off the
        event loop after the model is already serving; an in-process engine's RSS growth over its load
        (taken now, before requests change it), or the engine's own figure where that is larger
        (memory an earlier model freed is reused without growing the RSS)."""
        groups = [r.adapter.process.pid for r in lc.backend.replicas
                  if isinstance(r.adapter, ServerAdapter) and r.adapter.process.pid is not None]
        if groups:
            self._spawn(self._measure_groups(lc, groups))
            return
        if "ram" not in lc.estimate:
            return
        reported = sum(r.adapter.memory_bytes() or 0 for r in lc.backend.replicas)
        used = max(footprint.own_rss() - rss_before, reported)
        if used > 0:
            self._measured(lc, {"ram": used})

    async def _measure_groups(self, lc: ModelLifecycle, groups: list[int]) -> None:
        measured: dict[str, int] = {}
        for pgid in groups:
            for pool, used in (await asyncio.to_thread(footprint.measure_group, pgid)).items():
                measured[pool] = measured.get(pool, 0) + used
        if measured and lc.state is State.LOADED:
            self._measured(lc, measured)
            self._notify()

    def _measured(self, lc: ModelLifecycle, measured: dict[str, int]) -> None:
        lc.measured = measured
        self.observer.model_footprint(lc.name, sum(lc.estimate.values()), sum(measured.values()))

    async def _stop(self, lc: ModelLifecycle, why: str) -> None:
        lc.state = State.UNLOADING
        try:
            await lc.backend.stop()
        finally:
            lc.state, lc.reason, lc.draining = State.UNLOADED, f"unloaded ({why})", False
            lc.loaded_at = None
            footprint.release_freed_memory()
            self.observer.model_evicted(lc.name, why)
            log.info("model %s unloaded (%s)", lc.name, why)
            self._notify()

    @staticmethod
    async def _quiet_stop(lc: ModelLifecycle) -> None:
        try:
            await lc.backend.stop()
        except Exception as exc:  # a half-started engine: leave nothing behind, report the start's error
            log.debug("stopping %s after a failed start: %s", lc.name, exc)

    # -- admin, start-up, shutdown --------------------------------------------------------------

    async def load(self, lc: ModelLifecycle) -> None:
        """Load `lc` now (admin, preload) as a request would, without holding it."""
        if lc.state is State.FAILED:
            lc.failed_at = time.monotonic() - FAILED_RETRY_SECONDS
        release = await self.acquire(lc)
        release()

    async def unload(self, lc: ModelLifecycle, why: str = "admin") -> None:
        """Stop admitting requests to `lc`, wait (bounded) for its running ones, then unload it."""
        if lc.state is State.FAILED:
            lc.state, lc.reason = State.UNLOADED, ""
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.load_timeout
        lc.unload_asked = True  # requests that arrive now wait for the unload (then load it again)
        try:
            while lc.state is State.LOADING or (lc.state is State.LOADED and lc.in_flight > 0):
                left = deadline - loop.time()
                if left <= 0:
                    raise ModelUnavailable(f"model {lc.name!r} still has {lc.in_flight} request(s) running "
                                           f"after {self.load_timeout:g} s (load_timeout_seconds)", 5.0, "model_busy")
                await self._wait_changed(left)
            if lc.state is State.LOADED:
                await self._stop(lc, why)
        finally:
            lc.unload_asked = False
            self._notify()  # the requests that waited for the unload go on (and load the model again)

    async def preload(self) -> list[str]:
        """Load the preload models in order; returns the names that failed."""
        failed = []
        for lc in self:
            if lc.preload:
                try:
                    await self.load(lc)
                except ModelUnavailable as exc:
                    failed.append(f"{lc.name}: {exc.reason}")
        self._ttl_task = asyncio.ensure_future(self._watch_loop())
        return failed

    async def stop(self) -> None:
        if self._ttl_task is not None:
            self._ttl_task.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(lc.backend.stop() for lc in self), return_exceptions=True)
        for lc in self:
            lc.state = State.UNLOADED

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.sleep(TTL_CHECK_SECONDS)
            now = time.monotonic()
            for lc in list(self):
                gave_up = self._gave_up(lc)
                if gave_up is not None:
                    await self._fail_loaded(lc, gave_up)
                elif (lc.ttl_seconds is not None and lc.state is State.LOADED and lc.in_flight == 0
                        and lc.wanting == 0 and now - lc.last_used >= lc.ttl_seconds):
                    await self._stop(lc, "ttl")

    @staticmethod
    def _gave_up(lc: ModelLifecycle) -> str | None:
        """Why a loaded model's engines all stopped for good (a crash loop on every replica), else None."""
        if lc.state is not State.LOADED or not lc.backend.replicas:
            return None
        reasons = [r.adapter.gave_up() for r in lc.backend.replicas]
        if any(reason is None for reason in reasons):
            return None
        return "; ".join(dict.fromkeys(str(reason) for reason in reasons))

    async def _fail_loaded(self, lc: ModelLifecycle, reason: str) -> None:
        """A loaded model whose engine gave up is `failed`, as its engine is: stopped (nothing left running),
        answered 503 with the reason, loaded again by a request after FAILED_RETRY_SECONDS."""
        log.error("model %s: its engine gave up (%s); the model is failed", lc.name, reason)
        lc.state = State.UNLOADING
        await self._quiet_stop(lc)
        lc.state, lc.reason, lc.failed_at, lc.loaded_at = State.FAILED, f"engine failed: {reason}", time.monotonic(), None
        footprint.release_freed_memory()
        self.observer.model_evicted(lc.name, "engine_failed")
        self._notify()

    # -- plumbing ------------------------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait_changed(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except TimeoutError:
            pass


def _load_span(model: str) -> AbstractAsyncContextManager[object]:
    """A load's span (gateway/tracing) when tracing is on; nothing made when off."""
    if not tracing.ON:
        return contextlib.nullcontext()
    return spans.model_load(model)


def _start_span(model: str, engine: str) -> AbstractAsyncContextManager[object]:
    """One engine tried for a load; a start that raises marks it failed (the fallback's reason)."""
    if not tracing.ON:
        return contextlib.nullcontext()
    return spans.engine_start(model, engine)
