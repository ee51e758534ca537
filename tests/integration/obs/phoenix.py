"""A real OTLP receiver for the exemplar, engine-span and picture tests: Arize Phoenix (`phoenix serve`,
from the venv `scripts/engine_venvs.sh phoenix` makes), receiving OTLP/HTTP on its port and answering
span queries on its REST API (`/v1/projects/default/spans`); its UI shows a trace on the same port."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.engines.real_engines import engine_python
from tests.gateway_process import free_port

START_GUARD_S = 180.0  # hang guards, not performance assertions
SPANS_GUARD_S = 120.0


@dataclass
class Phoenix:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def traces_url(self) -> str:
        return self.url + "/v1/traces"

    def spans(self, trace_id: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
            body = httpx.get(f"{self.url}/v1/projects/default/spans", params=params, timeout=30).json()
            found += [s for s in body["data"] if s["context"]["trace_id"] == trace_id]
            cursor = body.get("next_cursor")
            if not cursor:
                return found

    def wait_for(self, trace_id: str, done: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
        deadline = time.monotonic() + SPANS_GUARD_S
        while True:
            spans = self.spans(trace_id)
            if done(spans):
                return spans
            if time.monotonic() > deadline:
                names = [s["name"] for s in spans]
                raise AssertionError(f"trace {trace_id} in Phoenix holds only {names}:\n{self.log_path.read_text()[-2000:]}")
            time.sleep(0.5)


@contextmanager
def phoenix(folder: Path) -> Iterator[Phoenix]:
    python = engine_python("PHOENIX_PYTHON", "phoenix", "import phoenix")
    port, grpc = free_port(), free_port()
    env = {**os.environ, "PHOENIX_WORKING_DIR": str(folder), "PHOENIX_HOST": "127.0.0.1", "PHOENIX_PORT": str(port),
           "PHOENIX_GRPC_PORT": str(grpc), "PHOENIX_TELEMETRY_ENABLED": "false"}
    log_path = folder / "phoenix.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([str(Path(python).parent / "phoenix"), "serve"], env=env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    running = Phoenix(f"http://127.0.0.1:{port}", process, log_path)
    try:
        deadline = time.monotonic() + START_GUARD_S
        while True:
            assert process.poll() is None, log_path.read_text()[-3000:]
            try:
                if httpx.get(running.url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"Phoenix not up after {START_GUARD_S} s"
            time.sleep(0.5)
        yield running
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def tracing_env(receiver: Phoenix) -> dict[str, str]:
    """A gateway traced into the receiver (OTLP/HTTP), exporting at once rather than every 5 s."""
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_SERVICE_NAME": "enginegate", "OTEL_BSP_SCHEDULE_DELAY": "200"}


def traceparent() -> tuple[str, str]:
    """A caller's W3C traceparent (sampled) and its trace id."""
    trace_id, parent = os.urandom(16).hex(), os.urandom(8).hex()
    return f"00-{trace_id}-{parent}-01", trace_id
