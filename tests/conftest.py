"""Every test (and every gateway it starts) reads and writes tune records in its own empty cache,
never the user's ~/.cache/enginegate/tune: a record there would change which engine serves; and
its data (the key store, stored responses) in its own empty $XDG_DATA_HOME: a key created there
would make every gateway require one."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest

from gateway.tuning import TUNE_DIR_ENV
from tests.otlp_receiver import Receiver, phoenix


@pytest.fixture(scope="session", autouse=True)
def _isolated_tune_cache() -> Iterator[None]:
    before = os.environ.get(TUNE_DIR_ENV)
    with tempfile.TemporaryDirectory(prefix="enginegate-tune-tests-") as tmp:
        os.environ[TUNE_DIR_ENV] = tmp
        yield
    if before is None:
        os.environ.pop(TUNE_DIR_ENV, None)
    else:
        os.environ[TUNE_DIR_ENV] = before


@pytest.fixture(scope="session", autouse=True)
def _isolated_data_home() -> Iterator[None]:
    before = os.environ.get("XDG_DATA_HOME")
    with tempfile.TemporaryDirectory(prefix="enginegate-data-tests-") as tmp:
        os.environ["XDG_DATA_HOME"] = tmp
        yield
    if before is None:
        os.environ.pop("XDG_DATA_HOME", None)
    else:
        os.environ["XDG_DATA_HOME"] = before


@pytest.fixture(scope="session")
def otlp_receiver() -> Iterator[Receiver]:
    """One real OTLP receiver (Phoenix, about a minute to start) for the whole run: each test finds its
    own spans by its trace id, so the traced modules share it."""
    with phoenix() as running:
        yield running
