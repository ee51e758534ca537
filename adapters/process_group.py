"""An engine's process group: who is still in it, and ending all of it.

Each engine is launched as the leader of its own session and process group (pgid = its pid), so
its workers (vLLM's EngineCore, tokenizer pools, resource trackers) are in that group too unless
they leave it. The leader's exit does not end them: every stop and crash path calls
`end_group`, which signals the whole group and waits until no live member is left.
Groups still alive when the interpreter exits are killed by an atexit hook.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal

import psutil

_live_groups: set[int] = set()


def track(pgid: int) -> None:
    _live_groups.add(pgid)


def untrack(pgid: int) -> None:
    _live_groups.discard(pgid)


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
