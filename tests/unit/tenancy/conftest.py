"""The stores these tests run against: a real redis-server per module, PostgreSQL's fixtures (one server for
the session), and `clients`: store clients on one data set, once per store in tests/stores/key_stores.STORES."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.postgres_server import postgres, postgres_url  # noqa: F401  (the postgres parameter's fixtures)
from tests.redis_server import RedisServer, redis_server
from tests.stores.key_stores import STORES, Clients


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


@pytest_asyncio.fixture(params=list(STORES))
async def clients(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Clients]:
    made = Clients(STORES[request.param](request, tmp_path))
    yield made
    await made.close()
