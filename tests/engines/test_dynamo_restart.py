"""Dynamo's worker restarted: readiness means a request would succeed.

The emulated frontend behaves as the real one was seen to: with no live worker it answers 503,
and after a worker (re)registers it lists the model at once but answers 503 for a while more
(`--worker-warmup`). /ready must not say ready in that window, and requests sent meanwhile wait
for the worker instead of failing."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from adapters.process import ProcessState
from tests.engines.test_engine_servers import SERVED, USER, gateway_for

pytestmark = pytest.mark.integration


def test_ready_after_a_worker_restart_means_requests_succeed(tmp_path: Path) -> None:
    with gateway_for("dynamo", tmp_path, "--tokens 3 --worker-warmup 1.5") as running:
        root = running.base_url.removesuffix("/v1")
        body = {"model": SERVED, "messages": USER}
        # start-up waited out the warm-up too: the first request succeeds
        assert httpx.post(running.base_url + "/chat/completions", json=body, timeout=60).status_code == 200
        worker = running.adapter.worker_process  # type: ignore[attr-defined]
        old_pid = worker.pid
        os.kill(old_pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while worker.restarts < 1:
            assert time.monotonic() < deadline, "the worker's crash was not noticed"
            time.sleep(0.02)
        ready = httpx.get(root + "/ready", timeout=10)
        assert ready.status_code == 503 and "worker starting" in ready.json()["models"][SERVED]["detail"]
        # sent while the worker restarts and warms up: it waits for it, then succeeds (not a 503)
        assert httpx.post(running.base_url + "/chat/completions", json=body, timeout=60).status_code == 200
        assert worker.restarts == 1 and worker.state is ProcessState.READY
        assert httpx.get(root + "/ready", timeout=10).status_code == 200
