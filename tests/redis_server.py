"""A real redis-server (Debian's) on a free port for the tenancy tests: append-only with fsync on
every write (so a kill -9 and a restart on the same port keep what was written), or, for the
benchmarks, Debian's default durability (no fsync per write)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from adapters.process import free_port


def require_redis_server() -> str:
    path = shutil.which("redis-server")
    if path is None:
        if os.environ.get("ENGINEGATE_REQUIRE_REAL_ENGINES"):
            pytest.fail("redis-server is not installed (apt-get install redis-server)")
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    return path


@dataclass
class RedisServer:
    port: int
    folder: Path
    fsync_always: bool = True
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [require_redis_server(), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder),
             *(("--appendonly", "yes", "--appendfsync", "always", "--save", "") if self.fsync_always else ()),
             "--protected-mode", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            assert self.process.poll() is None, "redis-server exited at start"
            time.sleep(0.05)
        raise RuntimeError("redis-server did not answer PING")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@contextmanager
def redis_server(fsync_always: bool = True) -> Iterator[RedisServer]:
    require_redis_server()
    with tempfile.TemporaryDirectory(prefix="enginegate-redis-") as folder:
        server = RedisServer(free_port(), Path(folder), fsync_always)
        server.start()
        try:
            yield server
        finally:
            server.kill()
