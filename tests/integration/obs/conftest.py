"""Fixtures for the observability integration tests: real gateway processes serving the embedded model."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway_process import REPO_ROOT, RunningGateway, gateway
from tests.integration.obs.traced import tracing_env
from tests.otlp_receiver import Receiver

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
def receiver(otlp_receiver: Receiver) -> Receiver:
    """The run's real OTLP receiver (Phoenix) the module's traced gateway exports to."""
    return otlp_receiver


@pytest.fixture(scope="module")
def traced_gateway(receiver: Receiver) -> Iterator[RunningGateway]:
    """The embedded model, every request traced into `receiver`."""
    with gateway(env=tracing_env(receiver)) as running:
        yield running
