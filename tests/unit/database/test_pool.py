"""The shared pool against a real PostgreSQL: failures of every kind become DatabaseUnavailable
(bounded by the timeout, the password never shown), and the pool recovers by itself when the server
returns."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest

from gateway.database import Database, DatabaseUnavailable, redact
from tests.postgres_server import PostgresServer, postgres, postgres_server, postgres_url  # noqa: F401  (fixtures)


@pytest.fixture(scope="module")
def own_server() -> Iterator[PostgresServer]:
    """A server these tests stop and start (never the session's shared one)."""
    with postgres_server() as server:
        yield server


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://eg:s3cret@db:5432/x", "postgresql://eg@db:5432/x"),
    ("postgresql://eg@db/x?password=s3cret&sslmode=require", "postgresql://eg@db/x?password=%2A%2A%2A&sslmode=require"),
    ("postgres://db1:5432,db2:5432/x", "postgres://db1:5432,db2:5432/x"),
    ("postgresql://eg:p%40ss@db/x", "postgresql://eg@db/x"),
])
def test_redact_drops_the_password(url: str, shown: str) -> None:
    assert redact(url) == shown


async def test_statements_and_transactions(postgres_url: str) -> None:
    db = Database(postgres_url, 5.0)
    try:
        await db.open()
        async with db.transaction() as conn:
            await conn.execute("CREATE TABLE t (x int)")
        with pytest.raises(KeyError):  # the caller's own error passes through unchanged, rolled back
            async with db.transaction() as conn:
                await conn.execute("INSERT INTO t VALUES (1)")
                raise KeyError("mine")
        assert await db.run(lambda conn: conn.fetchval("SELECT count(*) FROM t")) == 0
    finally:
        await db.close()


async def test_a_server_error_is_unavailable_not_transient_and_the_pool_stays_usable(postgres_url: str) -> None:
    db = Database(postgres_url, 5.0, max_size=1)
    try:
        with pytest.raises(DatabaseUnavailable) as caught:
            async with db.connection() as conn:
                await conn.execute("SELECT * FROM no_such_table")
        assert not caught.value.transient and "no_such_table" in caught.value.message
        assert await db.run(lambda conn: conn.fetchval("SELECT 1")) == 1
    finally:
        await db.close()


async def test_a_slow_statement_ends_at_the_timeout_and_its_connection_is_not_reused(postgres_url: str) -> None:
    db = Database(postgres_url, 0.5, max_size=1)
    try:
        with pytest.raises(DatabaseUnavailable) as caught:
            async with db.connection() as conn:
                await conn.execute("SELECT pg_sleep(30)")
        assert "did not answer within 0.5 s" in caught.value.message and caught.value.transient
        assert await db.run(lambda conn: conn.fetchval("SELECT 2")) == 2
    finally:
        await db.close()


async def test_a_server_that_accepts_and_never_answers_is_unavailable_at_the_timeout() -> None:
    """A black hole (a listening socket nobody serves): the connect itself must be bounded."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(8)
        db = Database(f"postgresql://eg:s3cret@127.0.0.1:{hole.getsockname()[1]}/x", 0.3)
        with pytest.raises(DatabaseUnavailable) as caught:
            await db.open()
        assert "did not answer within 0.3 s" in caught.value.message and "s3cret" not in caught.value.message
        await db.close()


async def test_a_missing_database_is_not_transient(postgres: PostgresServer) -> None:
    db = Database(postgres.url("no_such_db", password="s3cret"), 5.0)
    with pytest.raises(DatabaseUnavailable) as caught:
        await db.open()
    assert not caught.value.transient and "no_such_db" in caught.value.message
    assert "s3cret" not in caught.value.message
    await db.close()


async def test_a_closed_database_refuses(postgres_url: str) -> None:
    db = Database(postgres_url, 5.0)
    await db.open()
    await db.close()
    with pytest.raises(DatabaseUnavailable, match="closed"):
        await db.open()


async def test_server_stopped_then_started_recovers_without_a_new_pool(own_server: PostgresServer) -> None:
    url = own_server.createdb()
    db = Database(url, 2.0)
    try:
        # several pooled connections, all of which the restart kills
        async def hold(conn: object) -> int:
            await asyncio.sleep(0.05)
            return 1
        assert await asyncio.gather(*(db.run(hold) for _ in range(4))) == [1] * 4
        await asyncio.to_thread(own_server.stop)
        with pytest.raises(DatabaseUnavailable) as caught:
            await db.open()
        assert caught.value.transient
        await asyncio.to_thread(own_server.start)
        # the first operation after the restart succeeds, and so does every later one (the dead idle
        # connections are replaced, not handed out one failure at a time)
        for _ in range(6):
            assert await db.run(lambda conn: conn.fetchval("SELECT 3")) == 3
    finally:
        await db.close()


async def test_a_dead_pooled_connection_is_retried_once(own_server: PostgresServer) -> None:
    """The server restarts while the pool is idle and the loop has not yet seen the goodbye: run()
    meets a dead connection and retries on a fresh one."""
    url = own_server.createdb()
    db = Database(url, 5.0)
    try:
        async def hold(conn: object) -> int:
            await asyncio.sleep(0.05)
            return 1
        assert await asyncio.gather(*(db.run(hold) for _ in range(4))) == [1] * 4  # four idle connections
        own_server.stop()  # blocking, on purpose: this loop does not run until the server is back
        own_server.start()
        # one retry is enough: the first dead connection expires the other three
        for _ in range(6):
            assert await db.run(lambda conn: conn.fetchval("SELECT 4")) == 4
    finally:
        await db.close()
