"""The runtime loader's concurrency rule (adapters/lora_runtime.py) over an engine that records its calls:
two first requests load once, a held adapter is never evicted, a failed load answers its waiters and the next
request tries again, a client that leaves mid-load does not cancel the load, a restarted engine starts empty.
The real process test is tests/integration/test_lora_runtime.py (the vLLM emulator)."""

from __future__ import annotations

import asyncio

import pytest

from adapters.base import EngineError
from adapters.lora import LoraAdapter
from adapters.lora_runtime import RuntimeLoras

ADAPTERS = tuple(LoraAdapter(n, f"/w/{n}") for n in ("a", "b", "c"))


class Engine:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.gate: asyncio.Event | None = None
        self.broken: set[str] = set()

    async def load_lora(self, adapter: LoraAdapter) -> None:
        self.calls.append(f"load {adapter.name}")
        if self.gate is not None:
            await self.gate.wait()
        if adapter.name in self.broken:
            raise EngineError("No adapter found", 502)

    async def unload_lora(self, name: str) -> None:
        self.calls.append(f"unload {name}")


def loras(engine: Engine, capacity: int = 2, wait: float = 5.0) -> RuntimeLoras:
    return RuntimeLoras(engine, ADAPTERS, capacity, wait=wait)


def test_two_first_requests_load_once_and_both_hold_it() -> None:
    async def run() -> None:
        engine = Engine()
        engine.gate = asyncio.Event()
        rt = loras(engine)
        first = asyncio.gather(rt.acquire("a", 1), rt.acquire("a", 1))
        await asyncio.sleep(0)
        engine.gate.set()
        await first
        assert engine.calls == ["load a"] and rt.in_flight("a") == 2
        rt.release("a")
        rt.release("a")
        assert rt.in_flight("a") == 0 and rt.loaded() == {"a"}
    asyncio.run(run())


def test_the_least_recently_used_idle_one_is_evicted_never_one_in_flight() -> None:
    async def run() -> None:
        engine = Engine()
        rt = loras(engine)
        await rt.acquire("a", 1)  # a stays in flight
        await rt.acquire("b", 1)
        rt.release("b")
        await rt.acquire("c", 1)  # a is older but held: b goes
        assert engine.calls == ["load a", "load b", "unload b", "load c"]
        assert rt.loaded() == {"a", "c"}
    asyncio.run(run())


def test_a_request_waits_while_every_place_is_in_use_then_takes_the_freed_one() -> None:
    async def run() -> None:
        engine = Engine()
        rt = loras(engine)
        await rt.acquire("a", 1)
        await rt.acquire("b", 1)
        waiting = asyncio.create_task(rt.acquire("c", 1))
        await asyncio.sleep(0.01)
        assert not waiting.done() and engine.calls == ["load a", "load b"]
        rt.release("b")
        await waiting
        assert engine.calls[-2:] == ["unload b", "load c"] and rt.loaded() == {"a", "c"}
    asyncio.run(run())


def test_waiting_too_long_is_a_503_for_that_request_only() -> None:
    async def run() -> None:
        rt = loras(Engine(), capacity=1, wait=0.05)
        await rt.acquire("a", 1)
        with pytest.raises(EngineError) as err:
            await rt.acquire("b", 1)
        assert err.value.status == 503 and err.value.code == "adapter_slots_full"
        await rt.acquire("a", 1)  # the held one still serves
    asyncio.run(run())


def test_a_failed_load_answers_every_waiter_and_the_next_request_tries_again() -> None:
    async def run() -> None:
        engine = Engine()
        engine.broken.add("b")
        rt = loras(engine)
        results = await asyncio.gather(rt.acquire("b", 1), rt.acquire("b", 1), return_exceptions=True)
        assert all(isinstance(r, EngineError) and r.code == "adapter_load_failed" and r.status == 503
                   and "/w/b" not in str(r) for r in results), results  # the path is not told to clients
        assert engine.calls == ["load b"] and rt.loaded() == frozenset()
        await rt.acquire("a", 1)  # others are not affected
        engine.broken.clear()
        await rt.acquire("b", 1)
        assert engine.calls == ["load b", "load a", "load b"]
    asyncio.run(run())


def test_a_client_leaving_mid_load_cancels_only_its_wait() -> None:
    async def run() -> None:
        engine = Engine()
        engine.gate = asyncio.Event()
        rt = loras(engine)
        leaving = asyncio.create_task(rt.acquire("a", 1))
        staying = asyncio.create_task(rt.acquire("a", 1))
        await asyncio.sleep(0)
        leaving.cancel()
        await asyncio.sleep(0)
        engine.gate.set()
        await staying
        assert leaving.cancelled() and engine.calls == ["load a"] and rt.in_flight("a") == 1
    asyncio.run(run())


def test_a_restarted_engine_has_nothing_loaded() -> None:
    async def run() -> None:
        engine = Engine()
        rt = loras(engine)
        await rt.acquire("a", 1)
        rt.release("a")
        assert rt.loaded(1) == {"a"} and rt.loaded(2) == frozenset()
        await rt.acquire("a", 2)
        assert engine.calls == ["load a", "load a"]
        rt.release("a")
    asyncio.run(run())
