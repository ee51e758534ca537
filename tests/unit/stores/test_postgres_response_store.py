"""The stored-Responses contract (gateway/api/response_store.py) on the shared PostgreSQL, against a real
server: the same cases as the SQLite store's table (owner isolation, admin reach, per-owner pruning,
max_age, delete, concurrency), written over a `make` factory so they fold into that table; then what
only a server database has (several gateways on one database, the server down and back)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest

from gateway.api.postgres_response_store import PostgresResponseStore
from gateway.api.response_store import ANONYMOUS, ResponseStore, StoredResponse, StoreUnavailable
from gateway.database import Database
from tests.postgres_server import PostgresServer, postgres, postgres_server, postgres_url  # noqa: F401  (fixtures)

Make = Callable[..., Awaitable[ResponseStore]]
DAY = 24 * 3600.0


def record(response_id: str, owner: str | None, created_at: float | None = None, text: str = "hi") -> StoredResponse:
    item = {"type": "message", "id": f"msg_{response_id}", "role": "user", "content": [{"type": "input_text", "text": text}]}
    return StoredResponse(response_id, owner, time.time() if created_at is None else created_at,
                          {"id": response_id, "object": "response", "output": [], "text": text},
                          [item], [item, {"type": "message", "role": "assistant", "content": "ok"}])


@pytest.fixture
async def make(postgres_url: str) -> AsyncIterator[Make]:
    """Stores on one fresh database; each call is another gateway (its own pool)."""
    made: list[PostgresResponseStore] = []

    async def factory(max_age_s: float = 30 * DAY, max_count: int = 10_000) -> ResponseStore:
        store = PostgresResponseStore(Database(postgres_url, 5.0), max_age_s, max_count)
        made.append(store)
        await store.check()
        return store

    yield factory
    for store in made:
        await store.close()
        await store.db.close()


# -- the contract table ------------------------------------------------------------------------------

async def test_round_trip_keeps_the_record_exactly(make: Make) -> None:
    store = await make()
    original = record("resp_1", "team-a", text="nul \u0000 and ünïcode and \"quotes\"")
    await store.put(original)
    assert await store.get("resp_1", "team-a") == original
    assert await store.get("resp_missing", None) is None


async def test_an_id_no_record_can_have_is_missing_not_an_error(make: Make) -> None:
    """A client may send any id (a NUL in the path or in previous_response_id): it is a missing id."""
    store = await make()
    for response_id in ("resp_\x00x", "resp_" + "x" * 100_000, "résp_ünï", "resp_'; DROP TABLE responses; --"):
        assert await store.get(response_id, "team-a") is None
        assert await store.get(response_id, None) is None
        assert await store.delete(response_id, None) is False


async def test_another_owner_sees_it_exactly_as_a_missing_id(make: Make) -> None:
    store = await make()
    await store.put(record("resp_a", "team-a"))
    assert await store.get("resp_a", "team-b") is None
    assert await store.get("resp_a", ANONYMOUS) is None
    assert await store.delete("resp_a", "team-b") is False
    assert await store.get("resp_a", "team-a") is not None  # the failed delete left it


async def test_admin_reach_is_every_owner_and_ownerless_rows_are_admin_only(make: Make) -> None:
    store = await make()
    await store.put(record("resp_a", "team-a"))
    await store.put(record("resp_old", None))  # written before owners were recorded
    assert (await store.get("resp_a", None)).owner == "team-a"  # type: ignore[union-attr]
    assert await store.get("resp_old", None) is not None
    assert await store.get("resp_old", ANONYMOUS) is None and await store.get("resp_old", "team-a") is None
    assert await store.delete("resp_old", None) is True


async def test_delete_by_its_owner(make: Make) -> None:
    store = await make()
    await store.put(record("resp_a", "team-a"))
    assert await store.delete("resp_a", "team-a") is True
    assert await store.get("resp_a", None) is None
    assert await store.delete("resp_a", "team-a") is False


async def test_pruning_is_per_owner(make: Make) -> None:
    store = await make(max_count=3)
    now = time.time()
    await store.put(record("resp_b0", "team-b", now - 100))
    for i in range(5):
        await store.put(record(f"resp_a{i}", "team-a", now - 50 + i))
    kept = [i for i in range(5) if await store.get(f"resp_a{i}", None) is not None]
    assert kept == [2, 3, 4]  # the owner's newest three
    assert await store.get("resp_b0", "team-b") is not None  # team-a's writes never evict team-b's


async def test_max_age_hides_and_prunes(make: Make) -> None:
    store = await make(max_age_s=DAY)
    await store.put(record("resp_old", "team-a", time.time() - DAY - 60))
    assert await store.get("resp_old", "team-a") is None  # past max_age: as missing, even before pruning
    await store.put(record("resp_new", "team-b"))  # any owner's write prunes every owner's expired rows
    admin_view = PostgresResponseStore(store.db, 10 * DAY, 10_000)  # type: ignore[attr-defined]
    assert await admin_view.get("resp_old", None) is None  # gone, not just hidden


async def test_an_id_of_another_owner_is_never_replaced(make: Make) -> None:
    store = await make()
    await store.put(record("resp_x", "team-a", text="mine"))
    with pytest.raises(StoreUnavailable):
        await store.put(record("resp_x", "team-b", text="theirs"))
    assert (await store.get("resp_x", None)).response["text"] == "mine"  # type: ignore[union-attr]
    await store.put(record("resp_x", "team-a", text="mine again"))  # its owner may replace it
    assert (await store.get("resp_x", "team-a")).response["text"] == "mine again"  # type: ignore[union-attr]


async def test_concurrent_writes_of_one_owner_on_two_gateways_keep_exactly_max_count(make: Make) -> None:
    one, other = await make(max_count=5), await make(max_count=5)
    await one.put(record("resp_b", "team-b"))
    base = time.time()
    await asyncio.gather(*((one if i % 2 else other).put(record(f"resp_a{i:02d}", "team-a", base + i)) for i in range(24)))
    kept = [i for i in range(24) if await one.get(f"resp_a{i:02d}", "team-a") is not None]
    assert kept == [19, 20, 21, 22, 23]
    assert await other.get("resp_b", "team-b") is not None


async def _counts(store: ResponseStore) -> tuple[dict[str, int], dict[str, int]]:
    """(response_counts, the real count of rows) per owner key."""
    async with store.db.connection() as conn:  # type: ignore[attr-defined]
        kept = {r["owner_key"]: r["n"] for r in await conn.fetch("SELECT owner_key, n FROM response_counts WHERE n <> 0")}
        real = {r["k"]: r["n"] for r in await conn.fetch(
            "SELECT coalesce(owner, ' none') AS k, count(*) AS n FROM responses GROUP BY 1")}
    return kept, real


async def test_the_sweep_drops_every_owners_expired_records_and_the_counts_stay_exact(make: Make) -> None:
    long = await make(max_age_s=10 * DAY, max_count=4)
    now = time.time()
    for i in range(3):
        await long.put(record(f"resp_old{i}", "team-a", now - 2 * DAY + i))
    for i in range(6):
        await long.put(record(f"resp_b{i}", "team-b", now - 60 + i))
    await long.put(record("resp_legacy", None, now - 2 * DAY))
    await long.put(record("resp_b5", "team-b", now))  # its owner replaces it: no new row
    assert await long.delete("resp_b4", "team-b") and await long.delete("resp_b3", None)
    assert not await long.delete("resp_b2", "team-a")
    short = await make(max_age_s=DAY, max_count=4)  # another gateway, sweeping at its first write
    await short.put(record("resp_c", "team-c"))
    await short._sweeping  # type: ignore[attr-defined]  # beside the request: wait for it here
    assert await long.get("resp_old0", None) is None and await long.get("resp_legacy", None) is None
    kept, real = await _counts(long)
    assert kept == real == {"team-b": 2, "team-c": 1}


async def test_counts_stay_exact_under_concurrent_puts_and_deletes_on_two_gateways(make: Make) -> None:
    one, other = await make(max_count=6), await make(max_count=6)
    base = time.time()
    await asyncio.gather(*(one.put(record(f"resp_{i}", f"team-{i % 3}", base + i)) for i in range(30)))
    await asyncio.gather(*((one if i % 2 else other).delete(f"resp_{i}", None if i % 4 else f"team-{i % 3}")
                           for i in range(0, 30, 3)),
                         *(other.put(record(f"resp_n{i}", f"team-{i % 3}", base + 100 + i)) for i in range(9)))
    kept, real = await _counts(one)
    assert kept == real and all(n <= 6 for n in real.values())


# -- only a server database --------------------------------------------------------------------------

async def test_a_record_put_through_one_gateway_is_read_and_deleted_through_another(make: Make) -> None:
    one, other = await make(), await make()
    await one.put(record("resp_shared", "team-a"))
    assert await other.get("resp_shared", "team-a") == await one.get("resp_shared", "team-a")
    assert await other.delete("resp_shared", "team-a") is True
    assert await one.get("resp_shared", None) is None


@pytest.fixture(scope="module")
def own_server() -> Iterator[PostgresServer]:
    with postgres_server() as server:
        yield server


async def test_server_down_is_unavailable_without_naming_it_and_back_without_a_restart(own_server: PostgresServer) -> None:
    db = Database(own_server.createdb().replace("eg@", "eg:s3cret@"), 2.0)
    store = PostgresResponseStore(db, DAY, 100)
    try:
        await store.check()
        await store.put(record("resp_1", "team-a"))
        await asyncio.to_thread(own_server.stop)
        for call in (store.get("resp_1", "team-a"), store.put(record("resp_2", "team-a")), store.delete("resp_1", None)):
            with pytest.raises(StoreUnavailable) as caught:
                await call
            assert "retry later" in str(caught.value)
            assert "127.0.0.1" not in str(caught.value) and "s3cret" not in str(caught.value)
        await asyncio.to_thread(own_server.start)
        assert await store.get("resp_1", "team-a") is not None
        await store.put(record("resp_2", "team-a"))
    finally:
        await db.close()


async def test_started_before_its_database_it_migrates_on_first_use(own_server: PostgresServer) -> None:
    url = own_server.createdb()
    await asyncio.to_thread(own_server.stop)
    db = Database(url, 2.0)
    try:
        store = PostgresResponseStore(db, DAY, 100)
        await store.check()  # unreachable: start-up goes on
        with pytest.raises(StoreUnavailable):
            await store.get("resp_1", None)
        await asyncio.to_thread(own_server.start)
        await store.put(record("resp_1", "team-a"))
        assert await store.get("resp_1", "team-a") is not None
    finally:
        await asyncio.to_thread(own_server.start)  # a failed test leaves the module's server running
        await db.close()


async def test_a_database_that_refuses_fails_start_up_with_one_line(postgres: PostgresServer) -> None:
    db = Database(postgres.url("no_such_database", password="s3cret"), 2.0)
    with pytest.raises(StoreUnavailable) as caught:
        await PostgresResponseStore(db, DAY, 100).check()
    message = str(caught.value)
    assert "no_such_database" in message and "s3cret" not in message and "\n" not in message
    await db.close()
