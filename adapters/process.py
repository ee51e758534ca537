"""ManagedProcess: one engine server process, supervised as an explicit state machine.

    stopped -> starting -> ready -> stopping -> stopped
                |   ^ |        |
                |   +-+ <------+ (crash while serving, or a restart that failed before it was
                v                 ready: restart with backoff, back to starting)
              failed  (first start-up failure, a crash loop, or the supervisor itself failing)

Every state change goes through `_transition`, which checks it against `_ALLOWED`, so callers
never race on the state. One supervisor task per `start()` owns the process: it launches,
waits for readiness, waits for the exit, and restarts after a crash with exponential backoff
until the crash loop limit; it never ends silently (an unexpected error is logged and ends in
FAILED). `stop()` cancels the supervisor and stops the whole process group (SIGTERM, wait,
SIGKILL); a crash ends the rest of the group too (`process_group`). On Linux each engine gets
PR_SET_PDEATHSIG=SIGKILL, so an engine dies with the gateway even when the gateway is killed
outright (its own children only if they ask for the same).

Concurrency: all methods run on one event loop; `start()` calls are serialised by one lock and
`stop()` calls by another, so a stop can interrupt a start that waits for readiness.
Linux delivers the parent-death signal when the *thread* that spawned the engine exits, so the
event loop that starts engines must live as long as the gateway (uvicorn's main thread does).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import enum
import logging
import os
import secrets
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from adapters import process_group
from adapters.paths import open_private_log

log = logging.getLogger("enginegate.process")


class ProcessState(str, enum.Enum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    FAILED = "failed"


_ALLOWED: dict[ProcessState, frozenset[ProcessState]] = {
    ProcessState.STOPPED: frozenset({ProcessState.STARTING}),
    # starting -> starting: a restart that failed before it was ready tries again (backoff, crash count)
    ProcessState.STARTING: frozenset({ProcessState.STARTING, ProcessState.READY, ProcessState.FAILED, ProcessState.STOPPING}),
    ProcessState.READY: frozenset({ProcessState.STARTING, ProcessState.FAILED, ProcessState.STOPPING}),
    ProcessState.STOPPING: frozenset({ProcessState.STOPPED}),
    ProcessState.FAILED: frozenset({ProcessState.STARTING, ProcessState.STOPPING, ProcessState.STOPPED}),
}


class ProcessError(Exception):
    """The engine process could not start or is not serving (message carries its last log lines)."""


@dataclass(frozen=True, slots=True)
class Launch:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    """Added to the gateway's environment."""
    cwd: str | None = None


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the current launch listens and the key it requires."""

    host: str
    port: int
    api_key: str

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


LaunchFactory = Callable[[Endpoint], Launch]
ReadyProbe = Callable[["ManagedProcess", Endpoint], Awaitable[bool]]
"""Returns True once the engine serves; False while it loads; raises ProcessError if it cannot."""


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    max_crashes: int = 5
    """More crashes than this within `window` seconds is a crash loop: give up (FAILED)."""
    window: float = 300.0


READY_PROBE_MIN_GAP = 0.01
"""Seconds between readiness probes prompted by the engine's own output."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


_PR_SET_PDEATHSIG = 1


def _child_setup() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class ManagedProcess:
    def __init__(
        self,
        name: str,
        launch: LaunchFactory,
        probe: ReadyProbe,
        *,
        host: str = "127.0.0.1",
        startup_timeout: float = 300.0,
        stop_timeout: float = 10.0,
        poll_interval: float = 0.1,
        restart: RestartPolicy = RestartPolicy(),
        log_path: Path | None = None,
        ring_lines: int = 500,
        uses_api_key: bool = True,
    ) -> None:
        self.name = name
        self._launch = launch
        self._probe = probe
        self._host = host
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.poll_interval = poll_interval
        self.restart_policy = restart
        self.log_path = log_path
        self._ring: collections.deque[str] = collections.deque(maxlen=ring_lines)
        self._uses_api_key = uses_api_key

        self._state = ProcessState.STOPPED
        self.detail = ""
        self.endpoint: Endpoint | None = None
        self.pid: int | None = None
        self.restarts = 0
        self.last_exit_code: int | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._changed = asyncio.Event()  # set and replaced on every transition
        self._first: asyncio.Future[None] | None = None
        self._pump_task: asyncio.Task[None] | None = None
        self._stop_lock = asyncio.Lock()
        self._crash_times: collections.deque[float] = collections.deque()
        self._listeners: list[Callable[[ProcessState, str], None]] = []
        self._log_file: IO[str] | None = None
        self._output = asyncio.Event()  # set when the engine writes a line (it may have become ready)

    # -- state -------------------------------------------------------------------------------

    @property
    def state(self) -> ProcessState:
        return self._state

    def on_change(self, listener: Callable[[ProcessState, str], None]) -> None:
        self._listeners.append(listener)

    def _transition(self, new: ProcessState, detail: str = "") -> None:
        if new not in _ALLOWED[self._state]:
            raise RuntimeError(f"{self.name}: illegal transition {self._state.value} -> {new.value}")
        old, self._state, self.detail = self._state, new, detail
        level = logging.WARNING if new is ProcessState.FAILED else logging.INFO
        log.log(level, "%s: %s -> %s%s", self.name, old.value, new.value, f" ({detail})" if detail else "")
        self._note(f"[enginegate] state {old.value} -> {new.value}{': ' + detail if detail else ''}")
        for listener in self._listeners:
            listener(new, detail)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_ready(self, timeout: float) -> Endpoint:
        """Wait until READY (through a restart, if one is under way); raise ProcessError otherwise."""
        try:
            async with asyncio.timeout(timeout):
                while self._state is ProcessState.STARTING:
                    await self._changed.wait()
        except TimeoutError:
            raise ProcessError(f"{self.name} is not ready after {timeout:.0f}s ({self._state.value})") from None
        if self._state is not ProcessState.READY or self.endpoint is None:
            raise ProcessError(f"{self.name} is {self._state.value}" + (f": {self.detail}" if self.detail else ""))
        return self.endpoint

    async def wait_changed(self, timeout: float) -> None:
        """Wait for the next transition (or `timeout`)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._changed.wait()

    def exited(self) -> bool:
        """True once the engine process is gone, even before the supervisor has reaped it."""
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return True
        try:  # WNOWAIT: peek at the exit without reaping, which stays the child watcher's job
            return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True

    # -- logs --------------------------------------------------------------------------------

    def log_tail(self, lines: int = 50) -> list[str]:
        if lines <= 0:
            return []
        return list(self._ring)[-lines:]

    def saw(self, text: str) -> bool:
        """True if any line of the current launch's retained log contains `text`."""
        return any(text in line for line in self._ring)

    def _note(self, line: str) -> None:
        self._ring.append(line)
        if self._log_file is not None:
            with contextlib.suppress(OSError, ValueError):
                self._log_file.write(line + "\n")
                self._log_file.flush()

    async def _pump(self, stream: asyncio.StreamReader) -> None:
        while True:
            try:
                raw = await stream.readline()
            except ValueError:  # a line longer than the reader's limit: take what there is
                raw = await stream.read(65536)
            if not raw:
                return
            self._note(raw.decode("utf-8", "replace").rstrip("\r\n"))
            self._output.set()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> Endpoint:
        """Launch and return once ready; raise ProcessError (with the last log lines) if not."""
        async with self._lock:
            if self._state is ProcessState.READY and self.endpoint is not None:
                return self.endpoint
            if self._state not in (ProcessState.STOPPED, ProcessState.FAILED):
                raise ProcessError(f"{self.name} is {self._state.value}")
            self.restarts = 0
            self._crash_times.clear()
            if self.log_path is not None and self._log_file is None:
                self._log_file = open_private_log(self.log_path)
            self._transition(ProcessState.STARTING, "launching")
            first: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._first = first
            self._supervisor = asyncio.create_task(self._supervise(first), name=f"supervise-{self.name}")
            try:
                await first
            except ProcessError:
                await self._reap_supervisor()
                raise
            assert self.endpoint is not None
            return self.endpoint

    async def stop(self) -> None:
        """Stop now, also while a start is waiting for readiness (that start then raises)."""
        async with self._stop_lock:
            if self._state in (ProcessState.STOPPED, ProcessState.STOPPING):
                return
            self._transition(ProcessState.STOPPING)
            await self._reap_supervisor()
            await self._terminate()
            self._transition(ProcessState.STOPPED)
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None

    async def _reap_supervisor(self) -> None:
        task, self._supervisor = self._supervisor, None
        if task is not None and not task.done():
            task.cancel()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        first, self._first = self._first, None
        if first is not None and not first.done():
            first.set_exception(ProcessError(f"{self.name} was stopped while starting"))

    async def _supervise(self, first: asyncio.Future[None]) -> None:
        """The supervisor task: it never ends silently. Anything unexpected is logged with its
        traceback, the engine's group is ended and the state becomes FAILED, visible in /ready."""
        try:
            await self._supervise_loop(first)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            log.exception("%s: supervisor failed", self.name)
            reason = f"supervisor failed: {type(exc).__name__}: {exc}"
            with contextlib.suppress(Exception):
                await self._terminate()
            if self._state in (ProcessState.STARTING, ProcessState.READY):
                self._transition(ProcessState.FAILED, reason)
            if not first.done():
                first.set_exception(ProcessError(f"{self.name} {reason}"))

    async def _supervise_loop(self, first: asyncio.Future[None]) -> None:
        while True:
            try:
                endpoint = await self._launch_once()
                await self._await_ready(endpoint)
            except ProcessError as exc:
                await self._terminate()
                if not first.done():
                    self._transition(ProcessState.FAILED, str(exc).splitlines()[0])
                    first.set_exception(exc)
                    return
                if not await self._after_crash(str(exc).splitlines()[0]):
                    return
                continue
            self._transition(ProcessState.READY, f"pid {self.pid} on port {endpoint.port}")
            if not first.done():
                first.set_result(None)
            assert self._proc is not None
            code = await self._exit_code(self._proc)
            self.last_exit_code = code
            await self._terminate()  # the engine's workers outlive it unless its group is ended
            if not await self._after_crash(f"exited with code {code} while serving"):
                return

    async def _after_crash(self, reason: str) -> bool:
        """Record a crash; sleep the backoff and return True to restart, or give up (FAILED)."""
        now = time.monotonic()
        self._crash_times.append(now)
        while self._crash_times and now - self._crash_times[0] > self.restart_policy.window:
            self._crash_times.popleft()
        policy = self.restart_policy
        if len(self._crash_times) > policy.max_crashes:
            self._transition(
                ProcessState.FAILED,
                f"crash loop: {len(self._crash_times)} crashes in {policy.window:.0f}s, gave up; last: {reason}",
            )
            return False
        delay = min(policy.backoff_max, policy.backoff_initial * 2 ** (len(self._crash_times) - 1))
        self.restarts += 1
        self._transition(ProcessState.STARTING, f"{reason}; restart {self.restarts} in {delay:.1f}s")
        await asyncio.sleep(delay)
        return True

    async def _launch_once(self) -> Endpoint:
        key = secrets.token_hex(20) if self._uses_api_key else ""
        endpoint = Endpoint(self._host, free_port(self._host), key)
        try:
            spec = self._launch(endpoint)
        except ProcessError:
            raise
        except Exception as exc:  # the adapter's launch rule refused (missing file, bad option)
            raise ProcessError(f"{self.name}: {exc}") from exc
        env = {**os.environ, **spec.env}
        self._ring.clear()
        shown = " ".join(spec.argv)
        self._note(f"[enginegate] launch: {shown.replace(key, '***') if key else shown}")
        try:
            proc = await asyncio.create_subprocess_exec(
                *spec.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                cwd=spec.cwd,
                start_new_session=True,
                preexec_fn=_child_setup,
                limit=1 << 20,
            )
        except OSError as exc:
            raise ProcessError(f"{self.name}: cannot launch {spec.argv[0]}: {exc}") from exc
        self._proc, self.pid, self.endpoint = proc, proc.pid, endpoint
        process_group.track(proc.pid)
        assert proc.stdout is not None
        self._pump_task = asyncio.create_task(self._pump(proc.stdout), name=f"log-{self.name}")
        return endpoint

    async def _await_ready(self, endpoint: Endpoint) -> None:
        proc = self._proc
        assert proc is not None
        deadline = time.monotonic() + self.startup_timeout
        interval = self.poll_interval
        while True:
            if proc.returncode is not None:
                self.last_exit_code = proc.returncode
                raise ProcessError(self._failure(f"exited with code {proc.returncode} before it was ready"))
            try:
                if await self._probe(self, endpoint):
                    return
            except ProcessError as exc:
                raise ProcessError(self._failure(str(exc))) from None
            if time.monotonic() >= deadline:
                raise ProcessError(self._failure(f"not ready after {self.startup_timeout:.0f}s"))
            probed = time.monotonic()
            await self._until_news(proc, interval)
            # An engine that logs while it loads (llama-server: "model loaded", "listening") is
            # probed soon after each line, at most every READY_PROBE_MIN_GAP: its readiness is seen
            # within milliseconds, not at the next step of the backoff.
            gap = READY_PROBE_MIN_GAP - (time.monotonic() - probed)
            if gap > 0:
                await asyncio.sleep(gap)
            interval = min(interval * 1.5, 1.0)

    async def _until_news(self, proc: asyncio.subprocess.Process, timeout: float) -> None:
        """Wait up to `timeout` for the engine to exit or write a line."""
        self._output.clear()
        waits = [asyncio.ensure_future(self._exit_code(proc)), asyncio.ensure_future(self._output.wait())]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    def _failure(self, reason: str) -> str:
        tail = "\n".join(self.log_tail(20))
        return f"{self.name} {reason}\n--- last log lines ---\n{tail}"

    async def _terminate(self) -> None:
        """SIGTERM the process group, wait `stop_timeout` for the engine, then SIGKILL what is
        left of its group (workers included) and wait until none of it is alive."""
        proc = self._proc
        if proc is None:
            return
        pgid = proc.pid  # start_new_session: the engine leads its own group
        if proc.returncode is None:
            process_group.signal_group(pgid, signal.SIGTERM)
            try:
                async with asyncio.timeout(self.stop_timeout):
                    await self._exit_code(proc)
            except TimeoutError:
                self._note(f"[enginegate] no exit {self.stop_timeout:.0f}s after SIGTERM: SIGKILL")
                process_group.signal_group(pgid, signal.SIGKILL)
        self.last_exit_code = await self._exit_code(proc)
        stubborn = await process_group.end_group(pgid, grace=min(self.stop_timeout, 2.0))
        if stubborn:
            self._note(f"[enginegate] killed processes the engine left in its group: {stubborn}")
        with contextlib.suppress(TimeoutError):  # let asyncio finish the transport (pipes closed)
            async with asyncio.timeout(5.0):
                await proc.wait()
        self._proc = None

    async def _exit_code(self, proc: asyncio.subprocess.Process) -> int:
        """The exit code once the engine has exited. Not `proc.wait()`: asyncio wakes that only
        once every pipe is closed too, and workers the engine leaves behind hold its stdout."""
        while proc.returncode is None:
            await asyncio.sleep(min(self.poll_interval, 0.05))
        return proc.returncode
