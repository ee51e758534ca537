"""An engine's process group: who is still in it, and ending all of it.

Each engine is launched as the leader of its own session and process group (pgid = its pid), so
its workers (vLLM's EngineCore, tokenizer pools, resource trackers) are in that group too unless
they leave it. The leader's exit does not end them: every stop and crash path calls
`end_group`, which signals the whole group and waits until no live member is left.
Groups still alive when the interpreter exits are killed by an atexit hook, and when the gateway
dies without running it (SIGKILL, OOM killer) a watchdog process ends them: it learns each
group through a pipe from the gateway and kills those still listed when that pipe reaches EOF.
(The parent-death signal each engine gets covers the engine only, not its workers.)
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import subprocess
import sys

import psutil

_live_groups: set[int] = set()

# Ignores the signals a terminal or a killpg of the gateway's group send, so that it outlives the
# gateway; ends every group still listed once the gateway's end of the pipe closes.
WATCHDOG = """
import os, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
groups = set()
for line in sys.stdin.buffer:
    op, pgid = line[:1], int(line[1:])
    (groups.add if op == b"+" else groups.discard)(pgid)
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
"""
_watchdog: subprocess.Popen[bytes] | None = None


def _tell_watchdog(line: str) -> None:
    global _watchdog
    if _watchdog is None or _watchdog.poll() is not None:
        _watchdog = subprocess.Popen([sys.executable, "-c", WATCHDOG], stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, start_new_session=True)
        for pgid in _live_groups:  # a restarted watchdog learns what the last one knew
            _write(f"+{pgid}\n")
    _write(line)


def _write(line: str) -> None:
    assert _watchdog is not None and _watchdog.stdin is not None
    with contextlib.suppress(OSError):
        _watchdog.stdin.write(line.encode())
        _watchdog.stdin.flush()


def track(pgid: int) -> None:
    _live_groups.add(pgid)
    _tell_watchdog(f"+{pgid}\n")


def untrack(pgid: int) -> None:
    if pgid in _live_groups:
        _live_groups.discard(pgid)
        _tell_watchdog(f"-{pgid}\n")


@atexit.register
def _kill_live_groups() -> None:
    for pgid in list(_live_groups):
        signal_group(pgid, signal.SIGKILL)


def signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is `pgid`."""
    found: list[int] = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess, psutil.AccessDenied, PermissionError):
            continue
    return found


async def wait_empty(pgid: int, timeout: float, interval: float = 0.05) -> bool:
    """Wait up to `timeout` seconds for the group to have no live member; True if it is empty."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while members(pgid):
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(interval)
    return True


async def end_group(pgid: int, grace: float) -> list[int]:
    """SIGTERM what is left of the group, wait up to `grace`, then SIGKILL it and wait for the
    kill to land. Returns the pids that needed SIGKILL."""
    if not members(pgid):
        untrack(pgid)
        return []
    signal_group(pgid, signal.SIGTERM)
    if await wait_empty(pgid, grace):
        untrack(pgid)
        return []
    stubborn = members(pgid)
    signal_group(pgid, signal.SIGKILL)
    await wait_empty(pgid, 5.0)
    untrack(pgid)
    return stubborn
