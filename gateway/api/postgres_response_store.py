"""Stored Responses in the shared PostgreSQL (`database_url`): every gateway naming the database reads
and continues every conversation, within the contract of gateway/api/response_store.py.

Records are kept as the bytes the gateway serialized (bytea, not jsonb: jsonb reorders keys and
refuses a NUL character a client may well send). A put upserts its record and prunes its owner's records
(expired ones, then the oldest beyond max_count, found from a per-owner count) in one transaction
under that owner's advisory lock, so concurrent writes of one owner on any number of gateways never
leave more than max_count, and transactions never wait on each other in a cycle (every change to an
owner's records and count takes that owner's lock first, and only it). Another owner's record with
the same id is never replaced. Every owner's expired records are swept at most once a minute per
gateway; until then get() already answers them as missing.

Faults: the database unreachable or too slow answers StoreUnavailable (503) within
`tenancy.store_timeout_seconds`, naming no host or user to the client (the log has them, once per
outage). Start-up with the database unreachable does not fail: the schema is migrated on the first
use that reaches it, so a gateway started before its database (a pod beside a starting PostgreSQL)
serves everything else and recovers by itself. A database that answers with an error waiting will not
fix (wrong password, no such database) fails start-up with that one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg
import orjson

from gateway.api.response_store import StoredResponse, StoreUnavailable
from gateway.database import Database, DatabaseUnavailable, migrate

log = logging.getLogger("enginegate.responses")
T = TypeVar("T")
COMPONENT = "responses"
PRUNE_LOCK_CLASS = 0x7265  # pg_advisory_xact_lock(class, hashtext(owner)): one owner's puts, one at a time
STEPS = (
    """CREATE TABLE responses (
        id text PRIMARY KEY,
        owner text,
        created_at double precision NOT NULL,
        response bytea NOT NULL,
        input_items bytea NOT NULL,
        history bytea NOT NULL
    )""",
    "CREATE INDEX responses_owner_created_at ON responses (owner, created_at, id)",  # per-owner pruning
    "CREATE INDEX responses_created_at ON responses (created_at)",  # the sweep of every owner's expired rows
    # each owner's record count, so pruning at max_count touches only the records it drops (counting
    # 10,000 index entries on every write took 40 ms); changed only under the owner's advisory lock
    "CREATE TABLE response_counts (owner_key text PRIMARY KEY, n int NOT NULL)",
)
COLUMNS = "id, owner, created_at, response, input_items, history"
NO_OWNER = " none"
SWEEP_INTERVAL_S = 60.0
SWEEP_OWNERS = 100


def _owner_key(owner: str | None) -> str:
    """The owner's row in response_counts and its lock: NULL (records from before owners) as a name no
    key can have (key names start with a letter or digit; ANONYMOUS is the empty string)."""
    return NO_OWNER if owner is None else owner


def _owner_match(owner: str | None, first: int) -> tuple[str, list[Any]]:
    """The WHERE term for one owner's rows (its parameter numbered `first`) and its arguments."""
    return ("owner IS NULL", []) if owner is None else (f"owner = ${first}", [owner])


def _record(row: asyncpg.Record) -> StoredResponse:
    return StoredResponse(row["id"], row["owner"], row["created_at"], orjson.loads(row["response"]),
                          orjson.loads(row["input_items"]), orjson.loads(row["history"]))


class PostgresResponseStore:
    def __init__(self, db: Database, max_age_s: float, max_count: int) -> None:
        self.db = db
        self.max_age_s = max_age_s
        self.max_count = max_count
        self._migrated = False
        self._migrate_lock = asyncio.Lock()
        self._down = False
        self._next_sweep = 0.0
        self._sweeping: asyncio.Task[None] | None = None

    def describe(self) -> str:
        return self.db.describe()

    async def check(self) -> None:
        try:
            await self._call(self._ready_now)
        except StoreUnavailable as exc:
            cause = exc.__cause__
            if isinstance(cause, DatabaseUnavailable) and not cause.transient:
                raise StoreUnavailable(f"cannot use the response store: {cause.message}") from cause
            log.warning("the response store %s is unreachable at start-up; starting anyway: requests that need "
                        "it answer 503 until it answers, and its schema is migrated then", self.describe())

    async def _ready_now(self, timeout_s: float) -> None:
        if self._migrated:
            return
        async with self._migrate_lock:
            if not self._migrated:
                await migrate(self.db, COMPONENT, STEPS, timeout_s=timeout_s)
                self._migrated = True

    async def _call(self, work: Callable[[float], Awaitable[T]]) -> T:
        """One store operation, migrating first if needed; all of it within the store timeout."""
        limit = self.db.timeout_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        try:
            async with asyncio.timeout_at(deadline):
                await self._ready_now(limit)
                result = await work(max(0.001, deadline - loop.time()))
        except TimeoutError as exc:  # waiting behind another task's migration
            raise self._unavailable(DatabaseUnavailable(
                f"the database {self.describe()} did not answer within {limit:g} s")) from exc
        except DatabaseUnavailable as exc:
            raise self._unavailable(exc) from exc
        if self._down:
            self._down = False
            log.info("the response store %s answers again", self.describe())
        return result

    def _unavailable(self, exc: DatabaseUnavailable) -> StoreUnavailable:
        if not self._down:
            self._down = True
            log.warning("the response store cannot be used: %s", exc.message)
        why = "the shared database is unreachable or too slow" if exc.transient else "the shared database refused the operation"
        return StoreUnavailable(f"the response store is unavailable ({why}); retry later")

    async def put(self, record: StoredResponse) -> None:
        async def work(timeout_s: float) -> None:
            stored = await self.db.run(lambda conn: self._put(conn, record), transaction=True, timeout_s=timeout_s)
            if not stored:
                raise StoreUnavailable(f"the response id {record.id} is another owner's")
        await self._call(work)
        if time.monotonic() >= self._next_sweep and (self._sweeping is None or self._sweeping.done()):
            self._next_sweep = time.monotonic() + SWEEP_INTERVAL_S
            self._sweeping = asyncio.create_task(self._sweep())  # beside the request, never in its time

    async def _put(self, conn: asyncpg.Connection, record: StoredResponse) -> bool:
        """Under the owner's lock: upsert, drop the owner's expired records, then its oldest beyond max_count."""
        key = _owner_key(record.owner)
        await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", PRUNE_LOCK_CLASS, key)
        inserted = await conn.fetchval(
            f"INSERT INTO responses ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO UPDATE SET "
            "created_at = EXCLUDED.created_at, response = EXCLUDED.response, input_items = EXCLUDED.input_items, "
            "history = EXCLUDED.history WHERE responses.owner IS NOT DISTINCT FROM EXCLUDED.owner "
            "RETURNING xmax = 0",  # true: a new row; false: its owner replaced it; no row: another owner's id
            record.id, record.owner, record.created_at, orjson.dumps(record.response),
            orjson.dumps(record.input_items), orjson.dumps(record.history))
        if inserted is None:
            return False
        expired = await self._delete_expired(conn, record.owner)
        count = await conn.fetchval(
            "INSERT INTO response_counts (owner_key, n) VALUES ($1, $2) ON CONFLICT (owner_key) "
            "DO UPDATE SET n = response_counts.n + EXCLUDED.n RETURNING n", key, int(bool(inserted)) - expired)
        if count > self.max_count:
            match, args = _owner_match(record.owner, 2)
            pruned = await conn.fetchval(
                f"WITH gone AS (DELETE FROM responses WHERE id IN (SELECT id FROM responses WHERE {match} "
                "ORDER BY created_at, id LIMIT $1) RETURNING 1) SELECT count(*) FROM gone",
                count - self.max_count, *args)
            await conn.execute("UPDATE response_counts SET n = n - $2 WHERE owner_key = $1", key, pruned)
        return True

    async def _delete_expired(self, conn: asyncpg.Connection, owner: str | None) -> int:
        match, args = _owner_match(owner, 2)
        return await conn.fetchval(  # type: ignore[no-any-return]
            f"WITH gone AS (DELETE FROM responses WHERE {match} AND created_at < $1 RETURNING 1) "
            "SELECT count(*) FROM gone", time.time() - self.max_age_s, *args)

    async def _sweep(self) -> None:
        """Every owner's expired records, not only those of owners still writing (each owner under its
        lock, in its own short transaction); at most SWEEP_OWNERS owners a time. Best effort: a failure
        waits for the next sweep."""
        try:
            async with asyncio.timeout(self.db.timeout_s):
                await self._sweep_owners()
        except (DatabaseUnavailable, TimeoutError) as exc:
            log.debug("the expired-responses sweep did not finish: %s", exc)

    async def _sweep_owners(self) -> None:
        owners = await self.db.run(lambda conn: conn.fetch(
            "SELECT DISTINCT owner FROM responses WHERE created_at < $1 LIMIT $2",
            time.time() - self.max_age_s, SWEEP_OWNERS))
        for row in owners:
            await self.db.run(lambda conn, owner=row["owner"]: self._expire_owner(conn, owner), transaction=True)

    async def _expire_owner(self, conn: asyncpg.Connection, owner: str | None) -> None:
        key = _owner_key(owner)
        await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", PRUNE_LOCK_CLASS, key)
        expired = await self._delete_expired(conn, owner)
        await conn.execute("UPDATE response_counts SET n = n - $2 WHERE owner_key = $1", key, expired)

    async def get(self, response_id: str, owner: str | None) -> StoredResponse | None:
        if "\x00" in response_id:  # PostgreSQL text cannot hold it, so no record has it: missing, not a 503
            return None
        query = f"SELECT {COLUMNS} FROM responses WHERE id = $1 AND created_at >= $2"
        args: list[Any] = [response_id, time.time() - self.max_age_s]
        if owner is not None:
            query += " AND owner = $3"
            args.append(owner)
        row = await self._call(lambda timeout_s: self.db.run(lambda conn: conn.fetchrow(query, *args),
                                                             timeout_s=timeout_s))
        return None if row is None else _record(row)

    async def delete(self, response_id: str, owner: str | None) -> bool:
        if "\x00" in response_id:
            return False
        return await self._call(lambda timeout_s: self.db.run(lambda conn: self._delete(conn, response_id, owner),
                                                              transaction=True, timeout_s=timeout_s))

    async def _delete(self, conn: asyncpg.Connection, response_id: str, reach: str | None) -> bool:
        row = await conn.fetchrow("SELECT owner FROM responses WHERE id = $1", response_id)
        if row is None or (reach is not None and row["owner"] != reach):
            return False
        key = _owner_key(row["owner"])
        await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", PRUNE_LOCK_CLASS, key)
        match, args = _owner_match(row["owner"], 2)
        if await conn.execute(f"DELETE FROM responses WHERE id = $1 AND {match}", response_id, *args) == "DELETE 0":
            return False  # pruned or deleted meanwhile
        await conn.execute("UPDATE response_counts SET n = n - 1 WHERE owner_key = $1", key)
        return True

    async def close(self) -> None:
        """Stop a sweep in progress; the Database is the gateway's, closed at shutdown after every store."""
        if self._sweeping is not None and not self._sweeping.done():
            self._sweeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeping
