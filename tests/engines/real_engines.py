"""The real server engines that run on a CPU (vLLM's CPU build, Dynamo's frontend + mocker), each in
the virtualenv `scripts/engine_venvs.sh` makes and caches (`.ci/run` makes them before the tests).

A test finds the interpreter in its environment variable (VLLM_PYTHON, DYNAMO_PYTHON) or in the
cache; when neither has it, the test is skipped with the command that installs it, unless
ENGINEGATE_REQUIRE_REAL_ENGINES=1 (CI sets it), where a missing engine fails the test.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from adapters.paths import cache_dir
from tests.gateway_process import RunningGateway, gateway


def missing(reason: str) -> None:
    if os.environ.get("ENGINEGATE_REQUIRE_REAL_ENGINES") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def engine_python(env_var: str, venv: str, probe: str) -> str:
    """The interpreter that has the engine: $env_var, else $ENGINEGATE_CACHE/venvs/<venv>."""
    configured = os.environ.get(env_var)
    python = Path(configured) if configured else cache_dir() / "venvs" / venv / "bin" / "python"
    how = f"scripts/engine_venvs.sh {venv.split('-')[0]} makes it"
    if not python.is_file():
        missing(f"{python} does not exist ({env_var} unset; {how})")
    check = subprocess.run([str(python), "-c", probe], capture_output=True, timeout=300)
    if check.returncode != 0:
        missing(f"{python} cannot run {probe!r} ({how}): {check.stderr.decode()[-300:]}")
    return str(python)


@contextmanager
def serving(config_yaml: str, start_timeout: float) -> Iterator[RunningGateway]:
    """`enginegate serve --config` as a process of its own; on exit, every engine process it started must be gone."""
    with gateway(config_yaml=config_yaml, start_timeout=start_timeout) as running:
        engines = psutil.Process(running.process.pid).children(recursive=True)
        assert engines, "the gateway started no engine process"
        yield running
    gone, alive = psutil.wait_procs(engines, timeout=30)
    assert not alive, f"engine processes outlived the gateway: {[p.pid for p in alive]}"
