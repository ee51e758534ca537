"""ManagedProcess and ServerAdapter supervising a real engine process (the emulator)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from adapters.base import Completion, EngineError, RequestContext, StreamEvent
from adapters.process import ProcessState
from tests.integration.emulated_engine import REPO_ROOT, EmulatedEngine, emulated

pytestmark = pytest.mark.integration

PROMPT = {"model": "emulated-model", "messages": [{"role": "user", "content": "hi there"}]}
CTX = RequestContext("r", "emulated-model")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0): it is dead, only not yet reaped by its parent
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


async def wait_for(predicate, what: str, bound: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + bound
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        await asyncio.sleep(0.05)


async def chat_text(engine: EmulatedEngine, **extra: object) -> str:
    result = await engine.chat({**PROMPT, **extra}, CTX)
    assert isinstance(result, Completion) and isinstance(result.body, bytes)
    return str(orjson.loads(result.body)["choices"][0]["message"]["content"])


async def test_start_serve_stop_leaves_nothing(tmp_path: Path) -> None:
    engine = emulated(tmp_path, "llamacpp", "--tokens", "3")
    await engine.start()
    try:
        info = engine.describe()
        assert info["state"] == "ready" and (await engine.health()).ready
        pid = info["pid"]
        assert alive(pid)
        assert await chat_text(engine) == "tok0 tok1 tok2"
        stats = await engine.engine_stats()
        assert stats is not None and stats.generation_tokens_total == 3 and stats.requests_running == 0
    finally:
        await engine.stop()
    assert engine.process.state is ProcessState.STOPPED
    assert not alive(pid)
    log_text = Path(info["log_path"]).read_text()
    assert "emulator ready on" in log_text and "state stopping -> stopped" in log_text
    assert any("emulator ready on" in line for line in engine.logs(50))


@pytest.mark.parametrize("style", ["llamacpp", "vllm", "sglang", "mlx", "dynamo", "tabby", "trtllm"])
async def test_start_returns_only_once_the_engine_serves(tmp_path: Path, style: str) -> None:
    engine = emulated(tmp_path, style, "--tokens", "2", "--startup-delay", "1.0")
    await engine.start()
    try:
        assert await chat_text(engine) == "tok0 tok1"  # no 503, no refused connection, no bare 404
    finally:
        await engine.stop()


async def test_startup_timeout_names_the_engines_last_log_lines(tmp_path: Path) -> None:
    engine = emulated(tmp_path, "llamacpp", "--startup-delay", "60", startup_timeout=1.5)
    with pytest.raises(EngineError) as info:
        await engine.start()
    assert info.value.status == 503
    assert "not ready after 2s" in info.value.message or "not ready after 1s" in info.value.message
    assert "emulator listening on" in info.value.message  # the engine's own log, for the user
    assert engine.process.state is ProcessState.FAILED
    assert engine.process.pid is not None and not alive(engine.process.pid)
    await engine.stop()


async def test_engine_that_exits_at_launch_fails_clearly(tmp_path: Path) -> None:
    engine = emulated(tmp_path, "no-such-style")
    with pytest.raises(EngineError) as info:
        await engine.start()
    assert "exited with code 2 before it was ready" in info.value.message
    assert "invalid choice" in info.value.message  # argparse's complaint, from the log tail
    await engine.stop()


async def test_crash_while_serving_fails_the_request_then_restarts(tmp_path: Path) -> None:
    engine = emulated(tmp_path, "llamacpp", "--tokens", "6", "--crash-after-tokens", "3", restart_backoff=0.1)
    changes: list[tuple[ProcessState, str]] = []
    engine.process.on_change(lambda state, detail: changes.append((state, detail)))
    await engine.start()
    try:
        first_pid = engine.process.pid
        stream = await engine.chat({**PROMPT, "stream": True}, CTX)
        events: list[StreamEvent] = [e async for e in stream]  # type: ignore[union-attr]
        assert events[-1].is_error
        assert orjson.loads(events[-1].data)["error"]["code"] == "engine_disconnected"
        # the next request waits for the restart instead of failing
        assert await chat_text(engine, max_tokens=2) == "tok0 tok1"
        assert engine.process.pid != first_pid and engine.process.restarts == 1
        assert any(s is ProcessState.STARTING and "exited with code 1 while serving" in d for s, d in changes)
    finally:
        await engine.stop()


async def test_crash_loop_gives_up_with_a_clear_state(tmp_path: Path) -> None:
    engine = emulated(tmp_path, "vllm", restart_backoff=0.05, max_crashes=2, ready_wait=30)
    delays: list[str] = []
    engine.process.on_change(lambda state, detail: delays.append(detail) if "restart" in detail else None)
    await engine.start()
    try:
        for _ in range(3):
            await wait_for(lambda: engine.process.state is ProcessState.READY, "ready")
            assert engine.process.pid is not None
            os.kill(engine.process.pid, signal.SIGKILL)
            await wait_for(lambda: engine.process.state is not ProcessState.READY, "crash noticed")
        await wait_for(lambda: engine.process.state is ProcessState.FAILED, "crash loop verdict")
        health = await engine.health()
        assert not health.ready and "crash loop: 3 crashes" in health.detail
        assert [d.split("; ")[-1] for d in delays] == ["restart 1 in 0.1s", "restart 2 in 0.1s"]
        with pytest.raises(EngineError) as info:
            await engine.chat(PROMPT, CTX)
        assert info.value.status == 503 and "crash loop" in info.value.message
    finally:
        await engine.stop()


async def test_backoff_doubles(tmp_path: Path) -> None:
    engine = emulated(tmp_path, "vllm", restart_backoff=0.2, max_crashes=5)
    details: list[str] = []
    engine.process.on_change(lambda state, detail: details.append(detail) if "restart" in detail else None)
    await engine.start()
    try:
        for _ in range(3):
            await wait_for(lambda: engine.process.state is ProcessState.READY, "ready")
            os.kill(engine.process.pid, signal.SIGKILL)  # type: ignore[arg-type]
            await wait_for(lambda: engine.process.state is not ProcessState.READY, "crash noticed")
        await wait_for(lambda: engine.process.state is ProcessState.READY, "ready")
    finally:
        await engine.stop()
    assert [d.split("; ")[-1] for d in details] == ["restart 1 in 0.2s", "restart 2 in 0.4s", "restart 3 in 0.8s"]


async def test_stop_during_start_interrupts_it(tmp_path: Path) -> None:
    engine = emulated(tmp_path, "vllm", "--startup-delay", "60")
    starting = asyncio.create_task(engine.start())
    await wait_for(lambda: engine.process.pid is not None, "launch")
    pid = engine.process.pid
    await engine.stop()
    with pytest.raises(EngineError, match="stopped while starting"):
        await starting
    assert engine.process.state is ProcessState.STOPPED and not alive(pid)  # type: ignore[arg-type]


GATEWAY_SCRIPT = """
import asyncio, sys
from tests.integration.emulated_engine import emulated
from pathlib import Path

async def main():
    engine = emulated(Path(sys.argv[1]), "vllm")
    await engine.start()
    print(engine.process.pid, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def test_engine_dies_with_a_killed_gateway(tmp_path: Path) -> None:
    """SIGKILL leaves the gateway no chance to clean up: the parent-death signal must do it."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    gateway = subprocess.Popen([sys.executable, "-c", GATEWAY_SCRIPT, str(tmp_path)], cwd=REPO_ROOT, env=env,
                               stdout=subprocess.PIPE, text=True)
    try:
        assert gateway.stdout is not None
        engine_pid = int(gateway.stdout.readline())
        assert alive(engine_pid)
    finally:
        gateway.kill()
        gateway.wait()
    deadline = time.monotonic() + 10
    while alive(engine_pid):
        assert time.monotonic() < deadline, "engine orphaned after the gateway was killed"
        time.sleep(0.05)


async def test_non_streaming_request_in_flight_during_a_crash_is_sent_once_more(tmp_path: Path) -> None:
    """No response came, so the request goes once to the restarted engine; crashing it again ends it."""
    engine = emulated(tmp_path, "llamacpp", "--tokens", "6", "--crash-after-tokens", "3", restart_backoff=0.1)
    await engine.start()
    try:
        with pytest.raises(EngineError) as info:
            await engine.chat(PROMPT, CTX)
        assert info.value.status == 502 and info.value.code == "engine_reset"
        await wait_for(lambda: engine.process.restarts == 2 and engine.process.state is ProcessState.READY, "restarts")
        assert await chat_text(engine, max_tokens=2) == "tok0 tok1"
    finally:
        await engine.stop()


async def test_engine_logs_are_the_gateways_users_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Engines log what clients send (prompts, tool JSON): the logs folder is 0700 and each log 0600, also
    when an older gateway left them 0755 and 0644 (issue 32, item 7)."""
    from adapters.paths import logs_dir

    monkeypatch.setenv("ENGINEGATE_CACHE", str(tmp_path / "cache"))
    old_umask = os.umask(0o022)  # the usual umask, whatever the test runner's
    try:
        fresh = emulated(tmp_path, "llamacpp", "--tokens", "1", log_dir=None)  # the default folder, new
        await fresh.start()
        await fresh.stop()
        log = Path(fresh.describe()["log_path"])
        assert log.parent == logs_dir() and log.read_text()
        assert (logs_dir().stat().st_mode & 0o777, log.stat().st_mode & 0o777) == (0o700, 0o600)

        logs_dir().chmod(0o755)  # as an older gateway left them
        log.chmod(0o644)
        again = emulated(tmp_path, "llamacpp", "--tokens", "1", log_dir=None)
        await again.start()
        await again.stop()
        assert (logs_dir().stat().st_mode & 0o777, log.stat().st_mode & 0o777) == (0o700, 0o600)
    finally:
        os.umask(old_umask)
