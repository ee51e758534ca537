"""Start an engine emulator as a real process on a free port, and always clean it up.

    with running_emulator("vllm", "--ttft-ms", "50") as emu:
        httpx.get(f"{emu.base_url}/models")

`wait_ready=False` returns as soon as the process is spawned, for tests of the loading phase
(poll `emu.url` yourself; `emu.wait_ready()` blocks for the ready line later).
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from adapters.process import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_PREFIX = "emulator ready on "




@dataclass
class RunningEmulator:
    style: str
    port: int
    process: subprocess.Popen[bytes]
    stderr_file: IO[str]
    lines: list[str] = field(default_factory=list)
    _pending: bytes = b""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def stderr(self) -> str:
        self.stderr_file.flush()
        self.stderr_file.seek(0)
        return self.stderr_file.read()

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Block until the emulator prints its ready line; raise if it dies or times out."""
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self.process.stdout, selectors.EVENT_READ)
            while True:
                if any(line.startswith(READY_PREFIX) for line in self.lines):
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"emulator {self.style} not ready after {timeout}s: {self.stderr()}")
                if sel.select(timeout=min(left, 0.5)):
                    data = os.read(self.process.stdout.fileno(), 65536)
                    if data:
                        self._pending += data
                        *complete, self._pending = self._pending.split(b"\n")
                        self.lines.extend(line.decode(errors="replace") for line in complete)
                        continue
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"emulator {self.style} exited with {self.process.returncode}: {self.stderr()}"
                    )

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.process.wait(timeout=5)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.stderr_file.close()


def start_emulator(style: str, *args: str, port: int | None = None, wait_ready: bool = True,
                   timeout: float = 30.0) -> RunningEmulator:
    port = free_port() if port is None else port
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    stderr_file = tempfile.TemporaryFile("w+")
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.emulators.engine_emulator", "--style", style, "--port", str(port), *args],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr_file, start_new_session=True,
    )
    emu = RunningEmulator(style, port, process, stderr_file)
    if wait_ready:
        try:
            emu.wait_ready(timeout)
        except BaseException:
            emu.stop()
            raise
    return emu


@contextmanager
def running_emulator(style: str, *args: str, port: int | None = None, wait_ready: bool = True,
                     timeout: float = 30.0) -> Iterator[RunningEmulator]:
    emu = start_emulator(style, *args, port=port, wait_ready=wait_ready, timeout=timeout)
    try:
        yield emu
    finally:
        emu.stop()
