"""A replica's health: a circuit breaker fed by its requests (passive) and its engine's readiness (active).

    closed --(failure_threshold consecutive failures, or the engine not ready)--> open
    open --(a probe finds the engine ready again, or a new engine process)--> closed
    open --(open_seconds passed: a request, or a probe finding the engine ready)--> half_open
    half_open --(its one trial request succeeds)--> closed
    half_open --(the trial fails, or the engine not ready)--> open

An open breaker is probed on its own (gateway/routing/monitor.py), without waiting for traffic:
its engine's readiness, first after `PROBE_INITIAL_S`, then at doubling delays up to the monitor's
interval or `PROBE_CEILING_S`, whichever is shorter. What a probe decides (`after_probe`) and when the next one is due (`probe_delay`) are pure
functions; the breaker applies them. An engine that was not ready (crashed, restarting, starting)
and is ready again is closed at once, as at start-up; one that failed requests while it called itself
ready is let through one trial request once `open_seconds` have passed, unless it is a new process
(its incarnation changed: the failures were the old one's).

A failure is the engine's, never the client's: a 5xx from the engine, a connection it refused
or dropped, a timeout, a stream that ended with an error. A client's bad request (including an
engine's 5xx that says the input was refused: adapters/upstream_errors.py), an unsupported
option or a client that left are not counted either way.

Concurrency rule: used on the event loop only; `clock` is injectable for table tests.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass

from adapters.base import ClientRequestError, EngineError, UnsupportedError


class BreakerState(str, enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Cause(str, enum.Enum):
    """Why a breaker is not closed: the engine said it was not ready, or its requests failed."""

    NONE = "none"
    NOT_READY = "not_ready"
    FAILURES = "failures"


class Verdict(str, enum.Enum):
    """What one probe of the engine's readiness does to the breaker."""

    STAY = "stay"
    OPEN = "open"
    HALF_OPEN = "half_open"
    CLOSE = "close"


PROBE_INITIAL_S = 0.25
"""The first probe of an open breaker, after it opened; each probe that leaves it open doubles the delay."""
PROBE_CEILING_S = 2.0
"""The longest delay between two probes of an open breaker, whatever the monitor's interval: /ready
follows an engine that is back within about this long. A probe is a readiness check (a supervised
engine's process state, no I/O; an external one's model list), cheap at this rate."""


def after_probe(state: BreakerState, cause: Cause, ready: bool, *, cooled: bool, same_engine: bool) -> Verdict:
    """The breaker's move on one readiness probe (`cooled`: open_seconds have passed since it opened;
    `same_engine`: the engine process is the one whose requests failed)."""
    if not ready:
        return Verdict.OPEN
    if state is BreakerState.CLOSED:
        return Verdict.STAY
    if cause is not Cause.FAILURES or not same_engine:
        return Verdict.CLOSE
    if state is BreakerState.OPEN and cooled:
        return Verdict.HALF_OPEN
    return Verdict.STAY  # open and cooling down, or half-open: its trial request decides


def probe_delay(state: BreakerState, misses: int, interval: float, initial: float = PROBE_INITIAL_S,
                ceiling: float = PROBE_CEILING_S) -> float:
    """Seconds to the next readiness probe: the monitor's interval while closed or half-open; while
    open, `initial` doubled for each probe (`misses`) that left it open, never past the interval or `ceiling`."""
    if state is not BreakerState.OPEN:
        return interval
    return min(interval, ceiling, initial * 2 ** min(misses, 32))


RETRYABLE_CODES = frozenset({"engine_unreachable", "engine_reset", "engine_unavailable", "engine_start_failed",
                             "engine_disconnected"})
ONE_ADAPTER_CODES = frozenset({"adapter_load_failed", "adapter_slots_full"})
"""About one LoRA adapter on a working engine (a file it refused, its places all held): never the replica's
failure, or three requests for one broken adapter would take the base model and every other adapter out of
rotation with it."""


def is_failure(error: BaseException | None) -> bool | None:
    """True: the engine failed; False: it answered; None: says nothing about the engine (client's doing)."""
    if error is None:
        return False
    if isinstance(error, (ClientRequestError, UnsupportedError)):
        return None
    if isinstance(error, EngineError):
        return None if error.code in ONE_ADAPTER_CODES else error.status >= 500
    if isinstance(error, (TimeoutError, OSError)):
        return True
    if not isinstance(error, Exception):  # cancelled: the client left or the gateway is stopping
        return None
    return None  # a gateway bug is not the engine's fault


def is_retryable(error: BaseException) -> bool:
    """The engine could not take the request (refused, reset, down, overloaded: 503, or 429 from an
    upstream that queues on its own): another replica may serve it. An engine's other errors (a
    500 for this request, bad credentials) are not retried."""
    if isinstance(error, ClientRequestError):
        return error.status == 429
    if not isinstance(error, EngineError):
        return False
    return error.code in RETRYABLE_CODES or error.status == 503


@dataclass(slots=True)
class Breaker:
    failure_threshold: int = 3
    open_seconds: float = 5.0
    clock: Callable[[], float] = time.monotonic
    state: BreakerState = BreakerState.CLOSED
    failures: int = 0
    """Consecutive failures since the last success."""
    opened_at: float = 0.0
    probing: bool = False
    """A half-open trial request is in flight."""
    reason: str = ""
    opens: int = 0
    """Times it opened (a counter for /metrics)."""
    cause: Cause = Cause.NONE
    opened_on: object = None
    """The engine's incarnation (adapters/base.py) when its requests' failures opened it."""

    def allows(self) -> bool:
        """Whether a request may be sent now (half-open: only while no trial is in flight)."""
        if self.state is BreakerState.OPEN and self.clock() - self.opened_at >= self.open_seconds:
            self._to(BreakerState.HALF_OPEN, self.reason)
        if self.state is BreakerState.HALF_OPEN:
            return not self.probing
        return self.state is BreakerState.CLOSED

    def wants_probe(self) -> bool:
        return self.allows() and self.state is BreakerState.HALF_OPEN

    def dispatched(self) -> bool:
        """A request is on its way here; True when it is the half-open trial."""
        if self.state is BreakerState.HALF_OPEN and not self.probing:
            self.probing = True
            return True
        return False

    def undispatched(self, probe: bool) -> None:
        """That request never reached the engine (refused by the queue, or sent elsewhere)."""
        if probe and self.state is BreakerState.HALF_OPEN:
            self.probing = False

    def record(self, error: BaseException | None, incarnation: object = None) -> None:
        """A request on this replica ended (error None: it succeeded) on the engine `incarnation`."""
        failed = is_failure(error)
        if failed is None:
            if self.state is BreakerState.HALF_OPEN:
                self.probing = False  # the trial told us nothing: let another one through
            return
        if not failed:
            self.failures = 0
            if self.state is not BreakerState.CLOSED:
                self._to(BreakerState.CLOSED, "")
            return
        self.failures += 1
        what = f"{type(error).__name__}: {getattr(error, 'message', None) or error}"
        if self.state is BreakerState.HALF_OPEN or (self.state is BreakerState.CLOSED and self.failures >= self.failure_threshold):
            self._open(f"{self.failures} failure(s), last {what}"[:200], Cause.FAILURES)
            self.opened_on = incarnation

    def readiness(self, ready: bool, detail: str = "", incarnation: object = None) -> Verdict:
        """One probe of the engine's own readiness (active check) on the engine `incarnation`: not ready
        opens at once; ready again closes, or lets a trial through (`after_probe`)."""
        verdict = after_probe(self.state, self.cause, ready, cooled=self.clock() - self.opened_at >= self.open_seconds,
                              same_engine=incarnation == self.opened_on)
        if verdict is Verdict.OPEN:
            if self.state is not BreakerState.OPEN:
                self._open(f"not ready: {detail}"[:200], Cause.NOT_READY)
            else:
                self.opened_at = self.clock()
                self.reason = f"not ready: {detail}"[:200]
                self.cause = Cause.NOT_READY
        elif verdict is Verdict.CLOSE:
            self.failures = 0
            self._to(BreakerState.CLOSED, "")
        elif verdict is Verdict.HALF_OPEN:
            self._to(BreakerState.HALF_OPEN, self.reason)
        return verdict

    def _open(self, reason: str, cause: Cause) -> None:
        self.opened_at = self.clock()
        self.opens += 1
        self._to(BreakerState.OPEN, reason)
        self.cause = cause

    def _to(self, state: BreakerState, reason: str) -> None:
        self.state = state
        self.reason = reason
        self.probing = False
        if state is BreakerState.CLOSED:
            self.cause, self.opened_on = Cause.NONE, None
