"""The load a replica shows the balancer: its engine's own polled count only where others share the engine."""

from __future__ import annotations

from gateway.routing import Admission
from gateway.routing.pool import Replica
from tests.fakes import EchoAdapter


class Supervised(EchoAdapter):
    def incarnation(self) -> object:
        return (4242, 0)  # a process the gateway runs: it serves the gateway alone


def test_a_supervised_engines_polled_count_is_not_load() -> None:
    replica = Replica(Supervised(), Admission(2))
    replica.engine_running, replica.engine_waiting = 2, 1  # polled a moment ago: lags the gateway's own count
    assert replica.candidate().engine_load == 0.0


def test_a_shared_upstreams_count_is_load() -> None:
    replica = Replica(EchoAdapter(), Admission(2))  # an external URL: other clients count too
    replica.engine_running, replica.engine_waiting = 2, 1
    assert replica.candidate().engine_load == 3.0
