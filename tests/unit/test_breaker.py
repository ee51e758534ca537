"""The circuit breaker's transitions, as a table over a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from adapters.base import ClientRequestError, EngineError, UnsupportedError
from gateway.routing.health import (
    PROBE_CEILING_S,
    PROBE_INITIAL_S,
    Breaker,
    BreakerState,
    Cause,
    Verdict,
    after_probe,
    is_failure,
    is_retryable,
    probe_delay,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


ENGINE_DOWN = EngineError("refused", 503, "engine_unreachable")


@pytest.mark.parametrize(
    ("error", "failure"),
    [
        (None, False),
        (ENGINE_DOWN, True),
        (EngineError("stream broke", 502), True),
        (EngineError("timeout", 504, "upstream_timeout"), True),
        (TimeoutError(), True),
        (ClientRequestError("bad", 400), None),
        (EngineError("adapter x could not be loaded", 503, "adapter_load_failed"), None),
        (EngineError("adapter places held", 503, "adapter_slots_full"), None),
        (UnsupportedError("no tools"), None),
        (asyncio.CancelledError(), None),
        (ValueError("our bug"), None),
    ],
)
def test_what_counts_as_the_engines_failure(error: BaseException | None, failure: bool | None) -> None:
    assert is_failure(error) is failure


@pytest.mark.parametrize(
    ("error", "retry"),
    [
        (ENGINE_DOWN, True),
        (EngineError("reset", 502, "engine_reset"), True),
        (EngineError("overloaded", 503), True),
        (EngineError("engine error 500: boom", 502), False),  # the engine answered: it may be this request's fault
        (EngineError("rejected the gateway's credentials", 502, "upstream_auth"), False),
        (ClientRequestError("slow down", 429), True),  # an upstream that is full: try another
        (EngineError("slow", 504, "upstream_timeout"), False),
        (ClientRequestError("bad", 400), False),
    ],
)
def test_what_is_retried_elsewhere(error: BaseException, retry: bool) -> None:
    assert is_retryable(error) is retry


def test_opens_after_consecutive_failures_then_half_opens_and_closes() -> None:
    clock = Clock()
    b = Breaker(failure_threshold=3, open_seconds=5.0, clock=clock)
    b.record(ENGINE_DOWN)
    b.record(None)  # a success resets the count
    b.record(ENGINE_DOWN)
    b.record(ENGINE_DOWN)
    assert b.state is BreakerState.CLOSED and b.allows()
    b.record(ENGINE_DOWN)
    assert b.state is BreakerState.OPEN and not b.allows() and b.opens == 1
    clock.now += 4.9
    assert not b.allows()
    clock.now += 0.2
    assert b.wants_probe() and b.state is BreakerState.HALF_OPEN
    b.dispatched()
    assert not b.allows()  # one trial at a time
    b.record(None)
    assert b.state is BreakerState.CLOSED and b.allows() and b.failures == 0


def test_a_failed_probe_reopens() -> None:
    clock = Clock()
    b = Breaker(failure_threshold=1, open_seconds=1.0, clock=clock)
    b.record(ENGINE_DOWN)
    clock.now += 1.0
    assert b.wants_probe()
    b.dispatched()
    b.record(ENGINE_DOWN)
    assert b.state is BreakerState.OPEN and b.opens == 2 and not b.allows()


def test_a_probe_the_client_abandoned_lets_another_through() -> None:
    clock = Clock()
    b = Breaker(failure_threshold=1, open_seconds=1.0, clock=clock)
    b.record(ENGINE_DOWN)
    clock.now += 1.0
    b.allows()
    b.dispatched()
    b.record(asyncio.CancelledError())
    assert b.state is BreakerState.HALF_OPEN and b.wants_probe()


def test_client_errors_never_open_it() -> None:
    b = Breaker(failure_threshold=1)
    for _ in range(5):
        b.record(ClientRequestError("bad", 400))
    assert b.state is BreakerState.CLOSED


def test_readiness_opens_at_once_and_ready_again_closes() -> None:
    clock = Clock()
    b = Breaker(failure_threshold=3, open_seconds=60.0, clock=clock)
    b.readiness(True)
    assert b.state is BreakerState.CLOSED
    b.readiness(False, "starting")
    assert b.state is BreakerState.OPEN and b.reason == "not ready: starting"
    b.readiness(True)  # the engine is back, ready as at start-up: closed, without waiting open_seconds
    assert b.state is BreakerState.CLOSED and b.allows() and b.cause is Cause.NONE


def test_errors_with_a_ready_engine_wait_out_open_seconds() -> None:
    """An upstream that answers its model list but fails every request (503s) stays open until the timer."""
    clock = Clock()
    b = Breaker(failure_threshold=1, open_seconds=5.0, clock=clock)
    b.record(EngineError("overloaded", 503))
    b.readiness(True)
    assert b.state is BreakerState.OPEN
    clock.now += 5.0
    assert b.wants_probe()


OPEN, HALF, CLOSED = BreakerState.OPEN, BreakerState.HALF_OPEN, BreakerState.CLOSED


@pytest.mark.parametrize(
    ("state", "cause", "ready", "cooled", "same", "verdict"),
    [
        (CLOSED, Cause.NONE, True, False, True, Verdict.STAY),
        (CLOSED, Cause.NONE, False, False, True, Verdict.OPEN),
        (OPEN, Cause.NOT_READY, False, True, True, Verdict.OPEN),  # still down: stays open, the timer restarts
        (OPEN, Cause.NOT_READY, True, False, True, Verdict.CLOSE),  # restarted and ready: closed at once
        (OPEN, Cause.FAILURES, True, False, False, Verdict.CLOSE),  # a new engine process: the old one failed
        (OPEN, Cause.FAILURES, True, False, True, Verdict.STAY),  # ready but failing requests: cool down first
        (OPEN, Cause.FAILURES, True, True, True, Verdict.HALF_OPEN),  # then one trial request decides
        (OPEN, Cause.FAILURES, False, True, True, Verdict.OPEN),
        (HALF, Cause.FAILURES, True, True, True, Verdict.STAY),  # the trial request decides, not the probe
        (HALF, Cause.FAILURES, True, True, False, Verdict.CLOSE),
        (HALF, Cause.FAILURES, False, True, True, Verdict.OPEN),
    ],
)
def test_what_a_readiness_probe_decides(state: BreakerState, cause: Cause, ready: bool, cooled: bool, same: bool,
                                        verdict: Verdict) -> None:
    assert after_probe(state, cause, ready, cooled=cooled, same_engine=same) is verdict


@pytest.mark.parametrize(
    ("state", "misses", "delay", "interval"),
    [
        (CLOSED, 0, 2.0, 2.0),
        (HALF, 5, 2.0, 2.0),
        (OPEN, 0, PROBE_INITIAL_S, 2.0),
        (OPEN, 1, 2 * PROBE_INITIAL_S, 2.0),
        (OPEN, 2, 4 * PROBE_INITIAL_S, 2.0),
        (OPEN, 3, 2.0, 2.0),  # never slower than the closed poll
        (OPEN, 10**6, 2.0, 2.0),  # no overflow after a long outage
        (CLOSED, 0, 10.0, 10.0),  # a long interval
        (OPEN, 2, 1.0, 10.0),
        (OPEN, 5, PROBE_CEILING_S, 10.0),  # an open one is still probed every PROBE_CEILING_S at most
        (OPEN, 5, 0.5, 0.5),  # a short interval wins
    ],
)
def test_an_open_breaker_is_probed_sooner_with_backoff(state: BreakerState, misses: int, delay: float,
                                                       interval: float) -> None:
    assert probe_delay(state, misses, interval) == delay


def test_failures_on_an_engine_that_was_replaced_close_on_its_first_ready_probe() -> None:
    clock = Clock()
    b = Breaker(failure_threshold=1, open_seconds=60.0, clock=clock)
    b.record(EngineError("reset", 502, "engine_reset"), incarnation=(101, 0))
    assert b.state is BreakerState.OPEN and b.cause is Cause.FAILURES
    assert b.readiness(True, incarnation=(101, 0)) is Verdict.STAY  # the same process: wait open_seconds
    assert b.readiness(True, incarnation=(202, 1)) is Verdict.CLOSE  # restarted by its supervisor
    assert b.state is BreakerState.CLOSED and b.failures == 0


def test_a_ready_probe_after_open_seconds_half_opens_without_traffic() -> None:
    clock = Clock()
    b = Breaker(failure_threshold=1, open_seconds=5.0, clock=clock)
    b.record(EngineError("engine error 500: boom", 502))
    clock.now += 5.0
    assert b.readiness(True) is Verdict.HALF_OPEN and b.state is BreakerState.HALF_OPEN and b.wants_probe()
