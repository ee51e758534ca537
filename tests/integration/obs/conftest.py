"""Fixtures for the observability integration tests: real gateway processes serving the embedded model."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway_process import REPO_ROOT, RunningGateway, gateway
from tests.integration.obs.phoenix import Phoenix, phoenix, tracing_env

FAKE_NVML = Path(__file__).resolve().parent / "fake_nvml"
METRICS_KEY = "metrics-key-for-test"


@pytest.fixture(scope="module")
def gateway_with_fake_gpu() -> Iterator[RunningGateway]:
    """/metrics behind a key, and NVML emulated by fake_nvml/pynvml.py (first on the gateway's PYTHONPATH)."""
    env = {"ENGINEGATE_METRICS_API_KEY": METRICS_KEY, "PYTHONPATH": os.pathsep.join([str(FAKE_NVML), str(REPO_ROOT)])}
    with gateway(env=env) as running:
        yield running


@pytest.fixture(scope="module")
def plain_gateway() -> Iterator[RunningGateway]:
    with gateway() as running:
        yield running


@pytest.fixture(scope="module")
def receiver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    """A real OTLP receiver (Phoenix) the module's traced gateway exports to."""
    with phoenix(tmp_path_factory.mktemp("phoenix")) as running:
        yield running


@pytest.fixture(scope="module")
def traced_gateway(receiver: Phoenix) -> Iterator[RunningGateway]:
    """The embedded model, every request traced into `receiver`."""
    with gateway(env=tracing_env(receiver)) as running:
        yield running
