"""A replica's health: a circuit breaker fed by its requests (passive) and its engine's readiness (active).

    closed --(failure_threshold consecutive failures, or the engine not ready)--> open
    open --(open_seconds passed, or the engine ready again)--> half_open
    half_open --(its one trial request succeeds)--> closed
    half_open --(the trial fails, or the engine not ready)--> open

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


RETRYABLE_CODES = frozenset({"engine_unreachable", "engine_reset", "engine_unavailable", "engine_start_failed",
                             "engine_disconnected"})


def is_failure(error: BaseException | None) -> bool | None:
    """True: the engine failed; False: it answered; None: says nothing about the engine (client's doing)."""
    if error is None:
        return False
    if isinstance(error, (ClientRequestError, UnsupportedError)):
        return None
    if isinstance(error, EngineError):
        return error.status >= 500
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

    def record(self, error: BaseException | None) -> None:
        """A request on this replica ended (error None: it succeeded)."""
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
            self._open(f"{self.failures} failure(s), last {what}"[:200])

    def readiness(self, ready: bool, detail: str = "") -> None:
        """The engine's own readiness (active check): not ready opens at once; ready again lets a trial through."""
        if not ready:
            if self.state is not BreakerState.OPEN:
                self._open(f"not ready: {detail}"[:200])
            else:
                self.opened_at = self.clock()
                self.reason = f"not ready: {detail}"[:200]
        elif self.state is BreakerState.OPEN and self.reason.startswith("not ready"):
            self._to(BreakerState.HALF_OPEN, "ready again")

    def _open(self, reason: str) -> None:
        self.opened_at = self.clock()
        self.opens += 1
        self._to(BreakerState.OPEN, reason)

    def _to(self, state: BreakerState, reason: str) -> None:
        self.state = state
        self.reason = reason
        self.probing = False
