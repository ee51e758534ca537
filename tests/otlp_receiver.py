"""A real OTLP receiver for the tracing tests: Arize Phoenix (its own venv, `scripts/engine_venvs.sh phoenix`;
PHOENIX_PYTHON overrides), started on free ports in a temporary working directory, and asked for a trace's
spans over its REST API (`GET /v1/projects/default/spans/otlpv1?trace_id=`, spans in OTLP's own shape)."""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from adapters.process import free_port
from tests.engines.real_engines import engine_python

START_TIMEOUT_S = 300.0  # Phoenix imports and migrates its SQLite database: about a minute on a busy CPU
STATUS_ERROR = 2


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    kind: str
    """Phoenix answers SPAN_KIND_INTERNAL for every span: it keeps its own kinds, not OpenTelemetry's."""
    status: int
    status_message: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


def _hex(value: str | None) -> str | None:
    if not value:
        return None
    if len(value) in (16, 32) and all(c in "0123456789abcdef" for c in value):
        return value
    return base64.b64decode(value).hex()


def _value(v: dict[str, Any]) -> Any:
    if "array_value" in v and v["array_value"] is not None:
        return tuple(_value(x) for x in v["array_value"].get("values") or ())
    for key in ("string_value", "bool_value", "int_value", "double_value"):
        if v.get(key) is not None:
            return int(v[key]) if key == "int_value" else v[key]
    return None


def _attributes(items: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {kv["key"]: _value(kv.get("value") or {}) for kv in items or ()}


def _span(raw: dict[str, Any]) -> Span:
    status = raw.get("status") or {}
    return Span(
        name=raw["name"], trace_id=_hex(raw["trace_id"]) or "", span_id=_hex(raw["span_id"]) or "",
        parent_id=_hex(raw.get("parent_span_id")), kind=str(raw.get("kind")),
        status=int(status.get("code") or 0), status_message=status.get("message") or "",
        start_ns=int(raw.get("start_time_unix_nano") or 0), end_ns=int(raw.get("end_time_unix_nano") or 0),
        attributes=_attributes(raw.get("attributes")),
        events=[(e.get("name") or "", _attributes(e.get("attributes"))) for e in raw.get("events") or ()],
    )


@dataclass
class Receiver:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def otlp_endpoint(self) -> str:
        """For OTEL_EXPORTER_OTLP_ENDPOINT (http/protobuf: the exporter adds /v1/traces)."""
        return self.url

    def spans(self, trace_id: str) -> list[Span]:
        r = httpx.get(f"{self.url}/v1/projects/default/spans/otlpv1", params={"trace_id": trace_id, "limit": 1000},
                      timeout=10)
        if r.status_code == 404:  # no span received yet: the project does not exist
            return []
        r.raise_for_status()
        return [_span(s) for s in r.json()["data"]]

    def wait_for(self, trace_id: str, done: Callable[[list[Span]], bool], timeout: float = 30.0) -> list[Span]:
        deadline = time.monotonic() + timeout
        spans: list[Span] = []
        while time.monotonic() < deadline:
            spans = self.spans(trace_id)
            if done(spans):
                return spans
            time.sleep(0.25)
        raise AssertionError(f"trace {trace_id}: after {timeout}s the receiver holds {[s.name for s in spans]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def phoenix() -> Iterator[Receiver]:
    python = engine_python("PHOENIX_PYTHON", "phoenix", "import phoenix.server.main")
    workdir = Path(tempfile.mkdtemp(prefix="enginegate-phoenix-"))
    port, grpc_port = free_port(), free_port()
    env = {**os.environ, "PHOENIX_WORKING_DIR": str(workdir), "PHOENIX_HOST": "127.0.0.1", "PHOENIX_PORT": str(port),
           "PHOENIX_GRPC_PORT": str(grpc_port), "PHOENIX_TELEMETRY_ENABLED": "false"}
    env.pop("PYTHONPATH", None)
    for var in [k for k in env if k.startswith("OTEL_")]:
        env.pop(var)
    log_path = workdir / "phoenix.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([python, "-m", "phoenix.server.main", "serve"], cwd=workdir, env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    receiver = Receiver(f"http://127.0.0.1:{port}", proc, log_path)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"phoenix exited with {proc.returncode}:\n{receiver.log()[-3000:]}")
            try:
                if httpx.get(receiver.url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"phoenix not up after {START_TIMEOUT_S}s:\n{receiver.log()[-3000:]}")
            time.sleep(0.5)
        yield receiver
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)
