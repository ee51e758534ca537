"""The lifecycle's state machine on adapters that load instantly: the order of loads and evictions
when requests for two models that cannot both fit interleave (the real engines: tests/integration/
test_model_lifecycle.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from gateway.routing import Admission, Backend, Lifecycles, ModelLifecycle, ModelUnavailable, State
from tests.fakes import EchoAdapter

GPU = "gpu:0"  # a pool the fake adapters are never measured in, so the estimates stay


class Events:
    def __init__(self) -> None:
        self.log: list[str] = []

    def model_loaded(self, model: str, engine: str, seconds: float) -> None:
        self.log.append(f"load {model}")

    def model_load_failed(self, model: str, engine: str, fallback_to: str | None) -> None:
        self.log.append(f"fail {model}")

    def model_evicted(self, model: str, reason: str) -> None:
        self.log.append(f"evict {model} ({reason})")

    def model_load_wait(self, model: str, seconds: float) -> None: ...

    def model_footprint(self, model: str, estimated: int, measured: int | None) -> None: ...


def lifecycles(swap_batch: int, *names: str, pinned: tuple[str, ...] = ()) -> tuple[Lifecycles, Events]:
    events = Events()
    lcs = Lifecycles({GPU: 100}, load_timeout=5, swap_batch=swap_batch, observer=events)
    for name in names:
        backend = Backend(model_id=name, adapter=EchoAdapter(), admission=Admission(8, 8))
        lcs.add(ModelLifecycle(backend, {GPU: 80}, pinned=name in pinned))
    return lcs, events


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def interleave(lcs: Lifecycles) -> list[asyncio.Task[Callable[[], None]]]:
    """a is loaded and busy; then requests arrive for b, a, b, b (in that order)."""
    a, b = lcs.models["a"], lcs.models["b"]
    release_a = await lcs.acquire(a)
    tasks = []
    for lc in (b, a, b, b):
        tasks.append(asyncio.create_task(lcs.acquire(lc)))
        await settle()
    assert a.draining and a.state is State.LOADED  # busy: it stops admitting, never evicted under a request
    assert not any(t.done() for t in tasks)
    release_a()
    return tasks


async def drain_all(tasks: list[asyncio.Task[Callable[[], None]]]) -> None:
    pending = set(tasks)
    while pending:
        done, pending = await asyncio.wait(pending, timeout=5, return_when=asyncio.FIRST_COMPLETED)
        assert done
        await settle()
        for task in done:
            task.result()()


async def test_a_swapped_in_model_serves_the_requests_that_waited_for_it_before_the_next_swap() -> None:
    lcs, events = lifecycles(16, "a", "b")
    tasks = await interleave(lcs)
    b_requests = [tasks[0], tasks[2], tasks[3]]
    await asyncio.wait(b_requests, timeout=5)
    assert all(t.done() for t in b_requests) and not tasks[1].done()  # all of b's, then a's turn
    await drain_all(tasks)
    assert events.log == ["load a", "evict a (budget)", "load b", "evict b (budget)", "load a"]


async def test_without_batching_a_swap_may_follow_every_request() -> None:
    lcs, events = lifecycles(1, "a", "b")
    await drain_all(await interleave(lcs))
    assert events.log == ["load a", "evict a (budget)", "load b", "evict b (budget)", "load a",
                          "evict a (budget)", "load b"]


async def test_an_idle_model_is_evicted_lru_and_a_pinned_one_never() -> None:
    lcs, events = lifecycles(16, "p", "x", pinned=("p",))
    lcs.capacity[GPU] = 170
    (await lcs.acquire(lcs.models["x"]))()
    with pytest.raises(ModelUnavailable, match="pinned"):
        lcs.capacity[GPU] = 100
        (await lcs.acquire(lcs.models["p"]))()  # x is idle: evicted for p
        (await lcs.acquire(lcs.models["x"]))()  # p is pinned: x is refused at once
    assert events.log == ["load x", "evict x (budget)", "load p"]


async def test_a_draining_model_admits_again_once_nobody_waits_for_its_memory() -> None:
    lcs, _ = lifecycles(16, "a", "b")
    a, b = lcs.models["a"], lcs.models["b"]
    lcs.load_timeout = 0.2
    release_a = await lcs.acquire(a)
    with pytest.raises(ModelUnavailable, match="load_timeout_seconds"):
        await lcs.acquire(b)
    assert a.draining
    release_again = await asyncio.wait_for(lcs.acquire(a), 1)  # b's request gave up: a serves again
    release_a()
    release_again()
    assert not a.draining


async def test_an_unload_under_steady_traffic_admits_nothing_new_and_unloads_once_the_running_ones_end() -> None:
    lcs, events = lifecycles(16, "b")
    b = lcs.models["b"]
    await lcs.load(b)
    running = await lcs.acquire(b)
    unloading = asyncio.create_task(lcs.unload(b))
    await settle()
    newcomer = asyncio.create_task(lcs.acquire(b))  # no other model wants memory: it must wait all the same
    await settle()
    assert not newcomer.done() and not unloading.done() and b.in_flight == 1
    running()
    await asyncio.wait_for(unloading, 5)
    assert "evict b (admin)" in events.log
    (await asyncio.wait_for(newcomer, 5))()  # then it is served: the model loads again on demand
    assert events.log.count("load b") == 2 and not b.unload_asked


class Flaky(EchoAdapter):
    """An engine whose start fails while `broken`, and whose supervisor may give up (`gave_up_reason`)."""

    def __init__(self, engine: str, broken: bool = False) -> None:
        super().__init__()
        self.engine, self.broken, self.gave_up_reason, self.starts = engine, broken, None, 0

    async def start(self) -> None:
        self.starts += 1
        if self.broken:
            raise RuntimeError(f"{self.engine} cannot start")

    def gave_up(self) -> str | None:
        return self.gave_up_reason


def fallback_model() -> tuple[Lifecycles, ModelLifecycle, Flaky, Flaky]:
    from gateway.routing import EngineChoice, Replica

    preferred, fallback = Flaky("server", broken=True), Flaky("inproc")
    lcs = Lifecycles({GPU: 100}, load_timeout=5)
    choices = [EngineChoice("server", None, lambda: [Replica(preferred, Admission(8, 8))], {GPU: 10}, "chosen by the plan"),
               EngineChoice("inproc", None, lambda: [Replica(fallback, Admission(8, 8))], {GPU: 10}, "next ranked candidate")]
    backend = Backend(model_id="m", adapter=preferred, admission=Admission(8, 8))
    lc = ModelLifecycle(backend, {GPU: 10}, choices)
    lcs.add(lc)
    return lcs, lc, preferred, fallback


async def test_after_a_fallback_the_next_load_tries_the_preferred_engine_again_and_the_view_says_which_serves() -> None:
    lcs, lc, preferred, fallback = fallback_model()
    await lcs.load(lc)
    assert lc.backend.engine == "inproc" and lc.view()["engine"] == "inproc"
    assert lc.view()["engine_reason"].startswith("fallback: server failed to load (RuntimeError: server cannot start)")
    await lcs.unload(lc)
    preferred.broken = False
    await lcs.load(lc)
    assert lc.backend.engine == "server" and preferred.starts == 2
    assert lc.view()["engine_reason"] == "chosen by the plan"


async def test_a_loaded_model_whose_engine_gave_up_is_failed_everywhere() -> None:
    lcs, lc, preferred, _ = fallback_model()
    preferred.broken = False
    await lcs.load(lc)
    assert lcs._gave_up(lc) is None
    preferred.gave_up_reason = "crash loop: 2 crashes in 300s, gave up"
    reason = lcs._gave_up(lc)
    assert reason is not None
    await lcs._fail_loaded(lc, reason)
    assert lc.state is State.FAILED and "crash loop" in lc.view()["reason"]
    with pytest.raises(ModelUnavailable, match="crash loop"):
        await lcs.acquire(lc)
