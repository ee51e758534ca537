"""The stored-Responses contract (gateway/api/response_store.py), one table of tests run against every
implementation in tests/stores.RESPONSE_STORES: owners, admin reach, pruning, restarts, concurrency."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from gateway.api.response_store import ANONYMOUS, IdTaken, ResponseStore, StoredResponse
from tests.postgres_server import postgres  # noqa: F401  (the server fixture the postgres parameter uses)
from tests.stores import RESPONSE_STORES, SERVERS_NEEDED

Opener = Callable[..., ResponseStore]
HOUR = 3600.0


@pytest.fixture(params=sorted(RESPONSE_STORES))
async def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opener]:
    """open_store(max_age_s=..., max_count=...): a store at this test's place (every call: the same records)."""
    factory = RESPONSE_STORES[request.param]
    servers = {name: request.getfixturevalue(name) for name in SERVERS_NEEDED.get(request.param, ())}
    opened: list[ResponseStore] = []

    def open_(max_age_s: float = HOUR, max_count: int = 100) -> ResponseStore:
        store = factory(tmp_path, servers, max_age_s=max_age_s, max_count=max_count)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        await store.close()


def record(rid: str, owner: str | None, age: float = 0.0, text: str = "") -> StoredResponse:
    return StoredResponse(rid, owner, time.time() - age, {"id": rid, "owner_said": text or rid},
                          [{"id": f"in_{rid}", "type": "message", "content": text or rid}],
                          [{"id": f"in_{rid}"}, {"id": f"out_{rid}"}])


async def ids_of(store: ResponseStore, ids: list[str], owner: str | None) -> set[str]:
    found = await asyncio.gather(*(store.get(i, owner) for i in ids))
    return {r.id for r in found if r is not None}


async def test_a_record_reads_back_whole_with_its_owner(open_store: Opener) -> None:
    store = open_store()
    await store.check()
    assert isinstance(store.describe(), str) and store.describe()
    put = record("resp_a", "team-a", text="team-a's secret prompt")
    await store.put(put)
    got = await store.get("resp_a", "team-a")
    assert got is not None
    assert (got.id, got.owner, got.response, got.input_items, got.history) == (
        put.id, "team-a", put.response, put.input_items, put.history)
    assert got.created_at == pytest.approx(put.created_at)


@pytest.mark.parametrize(("reader", "sees"), [
    ("team-a", True),      # its owner
    (None, True),          # an admin, or a gateway without keys
    ("team-b", False),     # another tenant: exactly as a missing id
    (ANONYMOUS, False),    # what was stored without keys is not a tenant's
    ("team-a2", False),    # no prefix matching
    ("TEAM-A", False),     # names are exact
])
async def test_only_the_owner_or_an_admin_reads_a_record(open_store: Opener, reader: str | None, sees: bool) -> None:
    store = open_store()
    await store.put(record("resp_a", "team-a"))
    got = await store.get("resp_a", reader)
    assert (got is not None) is sees
    assert (await store.get("resp_missing", reader)) is None


async def test_another_owners_delete_is_a_missing_id_and_leaves_the_record(open_store: Opener) -> None:
    store = open_store()
    await store.put(record("resp_a", "team-a"))
    assert await store.delete("resp_a", "team-b") is False
    assert await store.delete("resp_missing", "team-b") is False
    assert await store.get("resp_a", "team-a") is not None
    assert await store.delete("resp_a", "team-a") is True
    assert await store.get("resp_a", "team-a") is None and await store.get("resp_a", None) is None
    assert await store.delete("resp_a", "team-a") is False  # once


async def test_an_admin_deletes_any_owners_record(open_store: Opener) -> None:
    store = open_store()
    await store.put(record("resp_a", "team-a"))
    await store.put(record("resp_anon", ANONYMOUS))
    assert await store.delete("resp_a", None) and await store.delete("resp_anon", None)
    assert await store.get("resp_a", "team-a") is None and await store.get("resp_anon", ANONYMOUS) is None


async def test_anonymous_records_are_their_own_owner(open_store: Opener) -> None:
    store = open_store()
    await store.put(record("resp_anon", ANONYMOUS))
    assert (await store.get("resp_anon", ANONYMOUS)) is not None
    assert (await store.get("resp_anon", "team-a")) is None


async def test_a_put_never_replaces_another_owners_record(open_store: Opener) -> None:
    store = open_store()
    await store.put(record("resp_x", "team-a", text="a's"))
    with pytest.raises(IdTaken):
        await store.put(record("resp_x", "team-b", text="b's"))
    got = await store.get("resp_x", None)
    assert got is not None and got.owner == "team-a" and got.response["owner_said"] == "a's"
    await store.put(record("resp_x", "team-a", text="a's again"))  # its own: replaced
    got = await store.get("resp_x", "team-a")
    assert got is not None and got.response["owner_said"] == "a's again"


async def test_pruning_is_per_owner(open_store: Opener) -> None:
    store = open_store(max_count=5)
    a_ids = [f"resp_a{i}" for i in range(5)]
    for rid in a_ids:
        await store.put(record(rid, "team-a"))
    b_ids = [f"resp_b{i:03}" for i in range(100)]
    for rid in b_ids:  # team-b's 100 writes
        await store.put(record(rid, "team-b"))
    assert await ids_of(store, a_ids, "team-a") == set(a_ids)  # never evict team-a's
    assert await ids_of(store, b_ids, None) == set(b_ids[-5:])  # team-b keeps its newest 5
    await store.put(record("resp_a5", "team-a"))
    assert await ids_of(store, [*a_ids, "resp_a5"], "team-a") == {*a_ids[1:], "resp_a5"}  # team-a's own oldest goes


async def test_records_past_max_age_are_never_served_and_pruned_for_every_owner(open_store: Opener) -> None:
    store = open_store()
    await store.put(record("resp_old", "team-a", age=2 * HOUR))  # older than max_age already
    assert await store.get("resp_old", "team-a") is None and await store.get("resp_old", None) is None
    assert await store.delete("resp_old", None) is False
    await store.put(record("resp_a", "team-a", age=600))
    strict = open_store(max_age_s=300)  # a gateway restarted with a shorter max_age: team-a's record is too old
    assert await strict.get("resp_a", "team-a") is None
    await strict.put(record("resp_b", "team-b"))  # another owner's write prunes it
    assert await open_store().get("resp_a", None) is None  # even for a store that would still serve it
    assert await open_store().get("resp_b", "team-b") is not None


async def test_records_survive_a_restart(open_store: Opener) -> None:
    first = open_store()
    await first.put(record("resp_a", "team-a"))
    await first.put(record("resp_anon", ANONYMOUS))
    await first.close()
    again = open_store()  # a restarted gateway
    await again.check()
    got = await again.get("resp_a", "team-a")
    assert got is not None and got.owner == "team-a" and got.history == record("resp_a", "team-a").history
    assert (await again.get("resp_anon", None)) is not None and (await again.get("resp_anon", "team-a")) is None


async def test_concurrent_writers_from_two_stores_keep_each_owners_newest(open_store: Opener) -> None:
    one, two = open_store(max_count=30), open_store(max_count=30)  # two gateways on the same records
    a_ids = [f"resp_a{i:02}" for i in range(40)]
    b_ids = [f"resp_b{i:02}" for i in range(10)]
    await asyncio.gather(*(s.put(record(rid, "team-a", age=100 - i)) for i, rid in enumerate(a_ids)
                           for s in [(one, two)[i % 2]]),
                         *(two.put(record(rid, "team-b")) for rid in b_ids))
    assert await ids_of(one, a_ids, "team-a") == set(a_ids[10:])  # the 30 newest by created_at
    assert await ids_of(two, b_ids, "team-b") == set(b_ids)
    assert await ids_of(one, a_ids + b_ids, "team-b") == set(b_ids)
