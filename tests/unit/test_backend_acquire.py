"""Backend.acquire over several replicas: the balancer's choice, then that replica's admission, health in between."""

from __future__ import annotations

import asyncio

import pytest

from gateway.config import RoutingConfig
from gateway.routing import Admission, Backend, QueueFull, Replica, RouteKey
from gateway.routing.balancer import rank
from gateway.routing.health import Breaker, BreakerState
from adapters.base import EngineError, EngineStats
from gateway.routing.monitor import poll
from tests.fakes import EchoAdapter


class Restartable(EchoAdapter):
    """An adapter whose process state the test sets (ready_now), as a supervised engine's."""

    def __init__(self) -> None:
        super().__init__()
        self.up = True

    def ready_now(self) -> bool | None:
        return self.up


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def backend(n: int = 2, slots: int | None = 1, max_queue: int = 4, clock: Clock | None = None, **routing: object) -> Backend:
    replicas = [Replica(Restartable(), Admission(slots, max_queue), name=str(i),
                        breaker=Breaker(1, 10.0, clock=clock or Clock())) for i in range(n)]
    return Backend(model_id="m", adapter=replicas[0].adapter, admission=replicas[0].admission, replicas=replicas,
                   routing=RoutingConfig.model_validate(routing))


def up(r: Replica) -> Restartable:
    assert isinstance(r.adapter, Restartable)
    return r.adapter


async def test_least_outstanding_fills_both_then_queues_and_refuses() -> None:
    b = backend(slots=1, max_queue=1)
    leases = [await b.acquire() for _ in range(2)]
    assert sorted(lease.replica.name for lease in leases) == ["0", "1"]
    waiters = [asyncio.create_task(b.acquire()) for _ in range(2)]
    await asyncio.sleep(0)
    assert b.waiting == 2 and b.running == 2
    with pytest.raises(QueueFull):
        await b.acquire()
    for lease in leases:
        lease.release()
    for lease in await asyncio.gather(*waiters):
        lease.release()
    assert (b.running, b.waiting) == (0, 0)


async def test_a_down_replica_is_skipped_and_a_waiter_on_it_moves() -> None:
    b = backend(slots=1, max_queue=4)
    first = await b.acquire()
    second = await b.acquire()
    victim = first.replica
    waiter = asyncio.create_task(b.acquire())  # both busy: it waits on one of them
    await asyncio.sleep(0)
    up(victim).up = False  # its engine died
    first.release(EngineError("gone", 502, "engine_reset"))
    second.release()
    lease = await waiter
    assert lease.replica is not victim and victim.admission.running == 0
    assert victim.served == 0  # the slot it handed back is no success


async def test_session_affinity_and_failover() -> None:
    b = backend(affinity="session")
    home = rank("s1", ["0", "1"])[0]
    route = RouteKey(session="s1")
    lease = await b.acquire(route)
    assert (lease.replica.name, lease.reason) == (str(home), "affinity")
    lease.release()
    up(b.replicas[home]).up = False
    lease = await b.acquire(route)
    assert (lease.replica.name, lease.reason) == (str(1 - home), "affinity_failover")
    lease.release()


async def test_a_retry_excludes_where_it_failed() -> None:
    b = backend(affinity="session")
    home = b.replicas[rank("s1", ["0", "1"])[0]]
    lease = await b.acquire(RouteKey(session="s1"), exclude=[home])
    assert lease.replica is not home and lease.reason == "affinity_failover"
    lease.release()


async def test_one_half_open_trial_at_a_time_and_a_refused_trial_frees_it() -> None:
    clock = Clock()
    b = backend(slots=1, max_queue=0, clock=clock)
    sick = b.replicas[0]
    sick.breaker.record(EngineError("down", 503))
    assert sick.breaker.state is BreakerState.OPEN
    for _ in range(3):  # open: everything goes to the other replica
        lease = await b.acquire()
        assert lease.replica.name == "1"
        lease.release()
    clock.now += 10.0
    await sick.admission.acquire()  # its one slot is busy and it has no queue
    busy = await b.acquire()  # (the trial goes elsewhere while it is full)
    assert busy.replica.name == "1" and not sick.breaker.probing
    with pytest.raises(QueueFull):
        await b.acquire()  # both full: the trial is chosen, then refused by the full queue...
    assert not sick.breaker.probing  # ...and does not leave the breaker waiting for it
    sick.admission.release()
    busy.release()
    trial = await b.acquire()
    assert (trial.replica.name, trial.reason) == ("0", "probe") and sick.breaker.probing
    other = await b.acquire()
    assert other.replica.name == "1"  # no second trial while the first is out
    trial.release()
    other.release()
    assert sick.breaker.state is BreakerState.CLOSED


async def test_health_and_summed_capacity() -> None:
    b = backend(slots=2)
    assert (await b.health()).ready and b.slots == 4
    up(b.replicas[0]).up = False
    b.replicas[0].breaker.readiness(False, "restarting")
    health = await b.health()
    assert health.ready and "1/2 replicas up" in health.detail
    b.replicas[1].breaker.readiness(False, "restarting")
    assert not (await b.health()).ready
    assert backend(slots=None).slots is None


class Reporting(Restartable):
    """Reports its engine's own queue, as llama-server's or vLLM's metrics do."""

    def __init__(self, waiting: float, kv: float | None = None) -> None:
        super().__init__()
        self.waiting, self.kv = waiting, kv

    async def engine_stats(self) -> EngineStats | None:
        return EngineStats(requests_running=2, requests_waiting=self.waiting, kv_cache_usage_ratio=self.kv)


@pytest.mark.parametrize(("waiting", "kv", "saturated"), [(0, 0.2, False), (3, 0.2, True), (0, 0.97, True), (0, None, False)])
async def test_the_engines_own_queue_and_kv_use_mark_a_replica_saturated(waiting: float, kv: float | None,
                                                                         saturated: bool) -> None:
    replica = Replica(Reporting(waiting, kv), Admission(None, 0))
    await poll(replica)
    candidate = replica.candidate()
    assert candidate.saturated is saturated and candidate.queueing is saturated and candidate.engine_load == 2 + waiting


async def test_a_busy_engine_is_passed_over_for_a_calm_one() -> None:
    """No gateway cap on either (external URLs): the engines' own waiting counts steer the choice."""
    replicas = [Replica(Reporting(5), Admission(None, 0), name="0"), Replica(Reporting(0), Admission(None, 0), name="1")]
    b = Backend(model_id="m", adapter=replicas[0].adapter, admission=replicas[0].admission, replicas=replicas)
    await asyncio.gather(*(poll(r) for r in replicas))
    leases = [await b.acquire() for _ in range(3)]
    assert [lease.replica.name for lease in leases] == ["1", "1", "1"]
