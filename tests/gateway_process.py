"""Start the real gateway (`python -m gateway serve`) as a subprocess for integration tests."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn
from starlette.types import ASGIApp

from adapters.process import free_port

REPO_ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 180.0


def listening_socket() -> socket.socket:
    """A socket bound to a free loopback port now, for uvicorn's `serve(sockets=[...])`: the port is held from
    the start, so the engines the app's lifespan starts (minutes for vLLM, with ports of their own) cannot take
    it before uvicorn binds, as they could with `free_port()` then a bind after the lifespan."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@asynccontextmanager
async def app_server(app: ASGIApp) -> AsyncIterator[str]:
    """Serve `app` with uvicorn on a free port in this event loop; yields its URL (http://127.0.0.1:PORT)."""
    sock = listening_socket()
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        assert not task.done(), "the gateway failed to start"
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@dataclass
class RunningGateway:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=10).text


@contextmanager
def gateway(args: list[str] | None = None, env: Mapping[str, str] | None = None, config_yaml: str | None = None,
            program: str | None = None, cwd: Path = REPO_ROOT, start_timeout: float = START_TIMEOUT_S) -> Iterator[RunningGateway]:
    """Serve from this checkout (`python -m gateway`), or run an installed `program` (no checkout on its path)."""
    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="enginegate-test-"))
    command = [program] if program else [sys.executable, "-m", "gateway"]
    argv = [*command, "serve", "--port", str(port), *(args or [])]
    if config_yaml is not None:
        (tmp / "config.yaml").write_text(config_yaml)
        argv += ["--config", str(tmp / "config.yaml")]
    log_path = tmp / "gateway.log"
    base = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if program:
        base.pop("PYTHONPATH", None)
    else:
        base["PYTHONPATH"] = str(REPO_ROOT)
    full_env = {**base, **(env or {})}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, cwd=cwd, env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    running = RunningGateway(proc, port, log_path)
    try:
        _wait_ready(running, start_timeout)
        yield running
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _wait_ready(gw: RunningGateway, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gw.process.poll() is not None:
            raise RuntimeError(f"gateway exited with {gw.process.returncode}:\n{gw.log()}")
        try:
            if httpx.get(gw.url + "/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"gateway not ready after {timeout}s:\n{gw.log()}")
