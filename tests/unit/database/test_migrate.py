"""Schema migration against a real PostgreSQL: steps in order, once, all or none, and two gateways
(two pools) starting at once against an empty database both come up."""

from __future__ import annotations

import asyncio

import pytest

from gateway.database import Database, DatabaseUnavailable, migrate
from tests.postgres_server import postgres, postgres_url  # noqa: F401  (fixtures)

STEPS = ["CREATE TABLE things (id int PRIMARY KEY)", "INSERT INTO things VALUES (1)"]


async def _version(db: Database, component: str) -> int | None:
    async with db.connection() as conn:
        return await conn.fetchval("SELECT version FROM schema_versions WHERE component = $1", component)  # type: ignore[no-any-return]


async def test_steps_apply_in_order_once_and_only_the_new_ones_later(postgres_url: str) -> None:
    db = Database(postgres_url, 5.0)
    try:
        await migrate(db, "things", STEPS)
        await migrate(db, "things", STEPS)  # a second start: nothing to do (CREATE TABLE again would fail)
        await migrate(db, "things", [*STEPS, "INSERT INTO things VALUES (2)"])
        async with db.connection() as conn:
            assert [r["id"] for r in await conn.fetch("SELECT id FROM things ORDER BY id")] == [1, 2]
        assert await _version(db, "things") == 3
    finally:
        await db.close()


async def test_components_are_versioned_apart(postgres_url: str) -> None:
    db = Database(postgres_url, 5.0)
    try:
        await migrate(db, "a", ["CREATE TABLE a (x int)"])
        await migrate(db, "b", ["CREATE TABLE b (x int)", "CREATE TABLE b2 (x int)"])
        assert (await _version(db, "a"), await _version(db, "b")) == (1, 2)
    finally:
        await db.close()


async def test_a_failing_step_leaves_the_schema_as_it_was(postgres_url: str) -> None:
    db = Database(postgres_url, 5.0)
    try:
        await migrate(db, "things", STEPS[:1])
        with pytest.raises(DatabaseUnavailable) as caught:
            await migrate(db, "things", [*STEPS, "INSERT INTO missing_table VALUES (1)"])
        assert not caught.value.transient  # the server refused it: waiting will not help
        assert await _version(db, "things") == 1
        async with db.connection() as conn:
            assert await conn.fetchval("SELECT count(*) FROM things") == 0  # step 2 rolled back with step 3
    finally:
        await db.close()


async def test_a_schema_migrated_by_a_newer_gateway_is_left_alone(postgres_url: str) -> None:
    db = Database(postgres_url, 5.0)
    try:
        await migrate(db, "things", [*STEPS, "INSERT INTO things VALUES (2)"])
        await migrate(db, "things", STEPS)  # an older gateway of a rolling upgrade starts
        assert await _version(db, "things") == 3
    finally:
        await db.close()


async def test_gateways_starting_at_once_on_an_empty_database_all_come_up(postgres_url: str) -> None:
    """Each its own pool, as separate processes have; without the lock, concurrent CREATE TABLE (even
    IF NOT EXISTS, schema_versions included) fails with a unique violation in pg_type."""
    gateways = [Database(postgres_url, 10.0) for _ in range(4)]
    try:
        await asyncio.gather(*(migrate(db, "things", STEPS) for db in gateways))
        async with gateways[0].connection() as conn:
            assert await conn.fetchval("SELECT count(*) FROM things") == 1  # step 2 ran once
        assert await _version(gateways[0], "things") == 2
    finally:
        await asyncio.gather(*(db.close() for db in gateways))
