from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.gateway_process import RunningGateway, gateway


@pytest.fixture(scope="session")
def gw() -> Iterator[RunningGateway]:
    """One gateway serving the embedded model for the whole session."""
    with gateway() as running:
        yield running
