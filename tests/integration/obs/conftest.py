"""Fixtures for the observability integration tests: a real gateway process serving the embedded model."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
# A hang guard for process start-up only (loading the model), never a performance assertion.
START_GUARD_S = 300.0
POLL_S = 0.25


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Gateway:
    url: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path


def wait_ready(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_GUARD_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"gateway exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/ready", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(POLL_S)
    raise RuntimeError(f"gateway not ready:\n{log.read_text()[-3000:]}")


def start_gateway(tmp: Path, env_extra: dict[str, str], pythonpath_first: list[Path] | None = None) -> Gateway:
    port = free_port()
    log = tmp / f"gateway-{port}.log"
    env = {**os.environ, **env_extra}
    env["PYTHONPATH"] = os.pathsep.join([*(str(p) for p in pythonpath_first or []), str(REPO), env.get("PYTHONPATH", "")])
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--port", str(port), "--log-level", "warning"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process, log)
    except Exception:
        process.kill()
        process.wait()
        raise
    return Gateway(url=url, port=port, process=process, log=log)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def gateway_with_fake_gpu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """The gateway with /metrics behind a key and NVML emulated (see fake_nvml/pynvml.py)."""
    tmp = tmp_path_factory.mktemp("gw")
    gw = start_gateway(tmp, {"ENGINEGATE_METRICS_API_KEY": "metrics-key-for-test"}, [HERE / "fake_nvml"])
    yield gw
    stop(gw.process)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("gw")
    gw = start_gateway(tmp, {})
    yield gw
    stop(gw.process)


CHAT = {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 12, "temperature": 0}


def send_traffic(url: str) -> None:
    """Non-streamed and streamed chats, a completion, a client that leaves mid-stream, an unknown model."""
    with httpx.Client(base_url=url, timeout=120) as client:
        for _ in range(2):
            assert client.post("/v1/chat/completions", json={"model": "default", **CHAT}).status_code == 200
        for _ in range(3):
            body = {"model": "default", **CHAT, "stream": True, "stream_options": {"include_usage": True}}
            with client.stream("POST", "/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                assert r.read().endswith(b"data: [DONE]\n\n")
        assert client.post("/v1/completions", json={"model": "default", "prompt": "Once upon", "max_tokens": 8}).status_code == 200
        with client.stream("POST", "/v1/chat/completions", json={"model": "default", **CHAT, "max_tokens": 200, "stream": True}) as r:
            next(r.iter_bytes())  # first event, then leave: the gateway must count a disconnect
        assert client.post("/v1/chat/completions", json={"model": "no-such-model", **CHAT}).status_code == 404
