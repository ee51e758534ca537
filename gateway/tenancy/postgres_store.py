"""The key store in the shared PostgreSQL database (`database_url`): keys, limits, leases and the
usage ledger of every gateway that names it.

Exactness: each `reserve` is one transaction that first takes a transaction-scoped advisory lock on
the tenant (`pg_advisory_xact_lock`), then reads the tenant's counters, decides with
`limits.check` and charges; so the reserves of one tenant are serialized across every gateway and
no two of them both take the last unit. Other tenants never wait for it. Settlements only add
(relative updates under row locks), so they take no tenant lock.

Time: windows, leases and the applied-ids table use the database's clock (`clock_timestamp()`),
one clock for every gateway whatever their own clocks say.

Schema: versioned with `migrate(db, "tenancy", STEPS)` on the store's first use (a gateway that
starts while the database is down comes up and migrates when it answers)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from gateway.tenancy.keys import KeyRecord
from gateway.tenancy.limits import Counters, Decision, Limits, check
from gateway.tenancy.store import (
    APPLIED_KEEP_MS,
    LEASE_TTL_MS,
    USAGE_FIELDS,
    KeyExists,
    KeysActive,
    Settlement,
    StoreUnavailable,
)

if TYPE_CHECKING:
    import asyncpg

    from gateway.database import Database

T = TypeVar("T")
COMPONENT = "tenancy"
LOCK_CLASS = 0x6B657973  # "keys": the first half of a tenant's advisory lock key (the second: hashtext(name))
NOW_MS = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"

STEPS: tuple[str, ...] = (
    """
    CREATE TABLE tenancy_keys (
        name text PRIMARY KEY,
        secret_hash text UNIQUE,
        record jsonb NOT NULL
    );
    CREATE TABLE tenancy_meta (key text PRIMARY KEY, value text NOT NULL);
    CREATE TABLE tenancy_windows (
        name text NOT NULL, kind text NOT NULL, started_ms bigint NOT NULL, count bigint NOT NULL,
        PRIMARY KEY (name, kind)
    );
    CREATE TABLE tenancy_leases (
        name text NOT NULL, request_id text NOT NULL, expires_ms bigint NOT NULL,
        PRIMARY KEY (name, request_id)
    );
    CREATE TABLE tenancy_applied (id text PRIMARY KEY, at_ms bigint NOT NULL);
    CREATE INDEX tenancy_applied_at ON tenancy_applied (at_ms);
    CREATE TABLE tenancy_budgets (
        name text NOT NULL, period text NOT NULL, used bigint NOT NULL, PRIMARY KEY (name, period)
    );
    CREATE TABLE tenancy_usage (
        name text NOT NULL, model text NOT NULL, day text NOT NULL,
        requests bigint NOT NULL DEFAULT 0, prompt_tokens bigint NOT NULL DEFAULT 0,
        completion_tokens bigint NOT NULL DEFAULT 0, errors bigint NOT NULL DEFAULT 0,
        rejected bigint NOT NULL DEFAULT 0, engine_ms bigint NOT NULL DEFAULT 0,
        PRIMARY KEY (name, day, model)
    );
    """,
)

SET_AUTH = ("INSERT INTO tenancy_meta (key, value) VALUES ('auth', $1) "
            "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value")

# $1 name, $2 reserve's applied id, $3 budget period: the counters as found, on the database's clock
READ = f"""
SELECT {NOW_MS} AS now_ms,
       EXISTS (SELECT 1 FROM tenancy_applied WHERE id = $2::text) AS replay,
       (SELECT started_ms FROM tenancy_windows WHERE name = $1::text AND kind = 'requests') AS r_started,
       (SELECT count FROM tenancy_windows WHERE name = $1::text AND kind = 'requests') AS r_count,
       (SELECT started_ms FROM tenancy_windows WHERE name = $1::text AND kind = 'tokens') AS t_started,
       (SELECT count FROM tenancy_windows WHERE name = $1::text AND kind = 'tokens') AS t_count,
       (SELECT count(*) FROM tenancy_leases WHERE name = $1::text AND expires_ms > {NOW_MS}) AS inflight,
       (SELECT used FROM tenancy_budgets WHERE name = $1::text AND period = $3::text) AS used
"""

# The admitted reserve's writes, one statement. $1 name, $2 now_ms, $3 window_ms, $4 cost, $5 request id,
# $6 applied id, $7 lease expiry, $8 budget period, $9..$12: rpm, tpm, concurrency, budget are set.
# A window's charge is sqlite_store's _add_window: an ended window starts again at now.
CHARGE = """
WITH requests AS (
    INSERT INTO tenancy_windows AS w (name, kind, started_ms, count)
    SELECT $1::text, 'requests', $2::bigint, 1 WHERE $9::boolean
    ON CONFLICT (name, kind) DO UPDATE SET
        count = CASE WHEN $2::bigint - w.started_ms >= $3::bigint THEN 1 ELSE w.count + 1 END,
        started_ms = CASE WHEN $2::bigint - w.started_ms >= $3::bigint THEN $2::bigint ELSE w.started_ms END
), tokens AS (
    INSERT INTO tenancy_windows AS w (name, kind, started_ms, count)
    SELECT $1::text, 'tokens', $2::bigint, GREATEST($4::bigint, 0) WHERE $10::boolean
    ON CONFLICT (name, kind) DO UPDATE SET
        count = CASE WHEN $2::bigint - w.started_ms >= $3::bigint THEN GREATEST($4::bigint, 0)
                     ELSE GREATEST(w.count + $4::bigint, 0) END,
        started_ms = CASE WHEN $2::bigint - w.started_ms >= $3::bigint THEN $2::bigint ELSE w.started_ms END
), expired AS (
    DELETE FROM tenancy_leases WHERE $11::boolean AND name = $1::text AND expires_ms <= $2::bigint
), lease AS (
    INSERT INTO tenancy_leases (name, request_id, expires_ms) SELECT $1::text, $5::text, $7::bigint WHERE $11::boolean
    ON CONFLICT (name, request_id) DO UPDATE SET expires_ms = EXCLUDED.expires_ms
), budget AS (
    INSERT INTO tenancy_budgets AS b (name, period, used)
    SELECT $1::text, $8::text, GREATEST($4::bigint, 0) WHERE $12::boolean
    ON CONFLICT (name, period) DO UPDATE SET used = GREATEST(b.used + $4::bigint, 0)
)
INSERT INTO tenancy_applied (id, at_ms) VALUES ($6::text, $2::bigint) ON CONFLICT (id) DO NOTHING
"""

# One settlement, one statement, applied once: every write is gated on its id being new in tenancy_applied
# (which is pruned of ids older than APPLIED_KEEP_MS here too). $1 applied id, $2 name, $3 request id,
# $4 release, $5 token delta, $6 tpm set, $7 budget set, $8 window_ms, $9 budget period, $10 keep ms,
# then the usage row: $11 name, $12 model, $13 day, $14.. the usage fields.
SETTLE = f"""
WITH pruned AS (
    DELETE FROM tenancy_applied WHERE at_ms < {NOW_MS} - $10::bigint
), fresh AS (
    INSERT INTO tenancy_applied (id, at_ms) VALUES ($1::text, {NOW_MS}) ON CONFLICT (id) DO NOTHING RETURNING at_ms
), lease AS (
    DELETE FROM tenancy_leases WHERE $4::boolean AND name = $2::text AND request_id = $3::text
        AND EXISTS (SELECT 1 FROM fresh)
), tokens AS (
    INSERT INTO tenancy_windows AS w (name, kind, started_ms, count)
    SELECT $2::text, 'tokens', f.at_ms, GREATEST($5::bigint, 0) FROM fresh f WHERE $6::boolean AND $5::bigint <> 0
    ON CONFLICT (name, kind) DO UPDATE SET
        count = CASE WHEN EXCLUDED.started_ms - w.started_ms >= $8::bigint THEN GREATEST($5::bigint, 0)
                     ELSE GREATEST(w.count + $5::bigint, 0) END,
        started_ms = CASE WHEN EXCLUDED.started_ms - w.started_ms >= $8::bigint THEN EXCLUDED.started_ms
                          ELSE w.started_ms END
), budget AS (
    INSERT INTO tenancy_budgets AS b (name, period, used)
    SELECT $2::text, $9::text, GREATEST($5::bigint, 0) FROM fresh WHERE $7::boolean AND $5::bigint <> 0
    ON CONFLICT (name, period) DO UPDATE SET used = GREATEST(b.used + $5::bigint, 0)
), usage AS (
    INSERT INTO tenancy_usage AS u (name, model, day, {', '.join(USAGE_FIELDS)})
    SELECT $11::text, $12::text, $13::text, {', '.join(f'${14 + i}::bigint' for i in range(len(USAGE_FIELDS)))} FROM fresh
    ON CONFLICT (name, day, model) DO UPDATE SET {', '.join(f'{f} = u.{f} + EXCLUDED.{f}' for f in USAGE_FIELDS)}
)
SELECT count(*) FROM fresh
"""


def _record(raw: str | None) -> KeyRecord | None:
    return KeyRecord.from_json(orjson.loads(raw)) if raw else None


def _window(started: int | None, count: int | None, now_ms: int, window_ms: int) -> tuple[int, int]:
    """(count, ms until the window resets); an ended window counts 0 (as sqlite_store's _window)."""
    if started is None or count is None or now_ms - started >= window_ms:
        return 0, window_ms
    return int(count), int(started + window_ms - now_ms)


class PostgresKeyStore:
    def __init__(self, db: Database, lease_ttl_ms: int = LEASE_TTL_MS, owns_database: bool = False) -> None:
        self.db = db
        self.lease_ttl_ms = lease_ttl_ms
        self.owns_database = owns_database
        """True for a store with its own pool (`enginegate keys`); a gateway's stores share the app's."""
        self._migrated = False
        self._migrating = asyncio.Lock()

    def describe(self) -> str:
        return self.db.describe()

    async def _ensure_schema(self) -> None:
        if self._migrated:
            return
        from gateway.database import migrate

        async with self._migrating:
            if not self._migrated:
                await migrate(self.db, COMPONENT, STEPS)
                self._migrated = True

    async def _run(self, work: Callable[[asyncpg.Connection], Awaitable[T]], transaction: bool = False) -> T:
        """`work` on a pooled connection; every database fault is StoreUnavailable. `work` may run twice
        (a connection that died under it is retried once), so every write is idempotent or checked."""
        from gateway.database import DatabaseUnavailable

        try:
            await self._ensure_schema()
            return await self.db.run(work, transaction=transaction)
        except DatabaseUnavailable as exc:
            raise StoreUnavailable(f"key store {exc.message}") from exc

    # -- keys --------------------------------------------------------------------------------
    async def lookup(self, secret_hash: str) -> KeyRecord | None:
        return _record(await self._run(lambda c: c.fetchval(
            "SELECT record::text FROM tenancy_keys WHERE secret_hash = $1", secret_hash)))

    async def get(self, name: str) -> KeyRecord | None:
        return _record(await self._run(lambda c: c.fetchval("SELECT record::text FROM tenancy_keys WHERE name = $1", name)))

    async def list(self) -> list[KeyRecord]:
        rows = await self._run(lambda c: c.fetch("SELECT record::text FROM tenancy_keys ORDER BY name"))
        return [KeyRecord.from_json(orjson.loads(r[0])) for r in rows]

    async def auth_enabled(self) -> bool:
        value = await self._run(lambda c: c.fetchval("SELECT value FROM tenancy_meta WHERE key = 'auth'"))
        return value == "1"

    async def disable_auth(self) -> None:
        async def work(c: asyncpg.Connection) -> None:
            await c.execute("LOCK TABLE tenancy_meta IN SHARE ROW EXCLUSIVE MODE")  # against a create at once
            active = await c.fetchval("SELECT name FROM tenancy_keys WHERE secret_hash IS NOT NULL ORDER BY name LIMIT 1")
            if active is not None:
                raise KeysActive(active)
            await c.execute(SET_AUTH, "0")

        await self._run(work, transaction=True)

    async def create(self, record: KeyRecord) -> None:
        async def work(c: asyncpg.Connection) -> None:
            await c.execute("LOCK TABLE tenancy_meta IN SHARE ROW EXCLUSIVE MODE")  # serialized with disable_auth
            made = await c.fetchval(
                "INSERT INTO tenancy_keys AS k (name, secret_hash, record) VALUES ($1, $2, $3::jsonb) "
                "ON CONFLICT (name) DO UPDATE SET secret_hash = EXCLUDED.secret_hash, record = EXCLUDED.record "
                "WHERE k.secret_hash IS NULL RETURNING 1",  # a revoked name may be made again
                record.name, record.secret_hash, orjson.dumps(record.to_json()).decode())
            if made is None:
                raise KeyExists(record.name)
            await c.execute(SET_AUTH, "1")

        await self._run(work, transaction=True)

    async def revoke(self, name: str, at: float) -> KeyRecord | None:
        return await self._update(name, lambda r: replace(r, revoked_at=at), None)

    async def replace_secret(self, name: str, secret_hash: str) -> KeyRecord | None:
        return await self._update(name, lambda r: replace(r, secret_hash=secret_hash), secret_hash)

    async def _update(self, name: str, change: Callable[[KeyRecord], KeyRecord], new_hash: str | None) -> KeyRecord | None:
        async def work(c: asyncpg.Connection) -> KeyRecord | None:
            row = await c.fetchrow("SELECT record::text, secret_hash FROM tenancy_keys WHERE name = $1 FOR UPDATE", name)
            if row is None or row[1] is None:
                return None  # unknown or already revoked
            record = change(KeyRecord.from_json(orjson.loads(row[0])))
            await c.execute("UPDATE tenancy_keys SET secret_hash = $2, record = $3::jsonb WHERE name = $1",
                            name, new_hash, orjson.dumps(record.to_json()).decode())
            return record

        return await self._run(work, transaction=True)

    # -- limits ------------------------------------------------------------------------------
    async def reserve(self, name: str, limits: Limits, cost: int, request_id: str) -> Decision:
        applied_id = "r:" + request_id

        async def work(c: asyncpg.Connection) -> Decision:
            await c.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", LOCK_CLASS, name)
            row = await c.fetchrow(READ, name, applied_id, limits.budget_period)
            now_ms = int(row["now_ms"])
            requests, requests_reset = (_window(row["r_started"], row["r_count"], now_ms, limits.window_ms)
                                        if limits.rpm else (0, 0))
            tokens, tokens_reset = (_window(row["t_started"], row["t_count"], now_ms, limits.window_ms)
                                    if limits.tpm else (0, 0))
            inflight = int(row["inflight"]) if limits.concurrency else 0
            used = int(row["used"] or 0) if limits.budget else 0
            found = Counters(requests, requests_reset, tokens, tokens_reset, inflight, used)
            if row["replay"]:
                return Decision(limits, found)  # charged once already: admitted as it was
            refused = check(limits, found, cost)
            if refused is not None:
                return Decision(limits, found, refused)
            await c.execute(CHARGE, name, now_ms, limits.window_ms, cost, request_id, applied_id,
                            now_ms + self.lease_ttl_ms, limits.budget_period, bool(limits.rpm), bool(limits.tpm),
                            bool(limits.concurrency), bool(limits.budget))
            return Decision(limits, Counters(requests + 1, requests_reset, tokens + cost, tokens_reset, inflight + 1,
                                             used + cost))

        return await self._run(work, transaction=True)

    async def renew(self, leases: list[tuple[str, str]]) -> None:
        if not leases:
            return
        names, ids = [n for n, _ in leases], [r for _, r in leases]
        await self._run(lambda c: c.execute(
            f"UPDATE tenancy_leases AS l SET expires_ms = {NOW_MS} + $3 FROM unnest($1::text[], $2::text[]) AS x(name, id) "
            f"WHERE l.name = x.name AND l.request_id = x.id AND l.expires_ms > {NOW_MS}",
            names, ids, self.lease_ttl_ms))

    async def release_leases(self, name: str) -> int:
        return int(await self._run(lambda c: c.fetchval(
            f"WITH gone AS (DELETE FROM tenancy_leases WHERE name = $1 RETURNING expires_ms) "
            f"SELECT count(*) FROM gone WHERE expires_ms > {NOW_MS}", name)))

    async def settle(self, settlements: list[Settlement]) -> None:
        if not settlements:
            return
        rows = [self._settle_args(s) for s in settlements]
        if len(rows) == 1:  # the common case: one statement, one round trip
            await self._run(lambda c: c.execute(SETTLE, *rows[0]))
            return
        await self._run(lambda c: c.executemany(SETTLE, rows), transaction=True)

    @staticmethod
    def _settle_args(s: Settlement) -> tuple[Any, ...]:
        limits, u = s.limits, s.usage
        return ("s:" + s.request_id, s.name, s.request_id, s.release, s.token_delta, bool(limits and limits.tpm),
                bool(limits and limits.budget), limits.window_ms if limits else 1, limits.budget_period if limits else "-",
                APPLIED_KEEP_MS, u.name, u.model, u.day, *(getattr(u, f) for f in USAGE_FIELDS))

    async def usage(self, name: str | None = None, since: str | None = None) -> list[dict[str, Any]]:
        rows = await self._run(lambda c: c.fetch(
            f"SELECT name, model, day, {', '.join(USAGE_FIELDS)} FROM tenancy_usage "
            "WHERE ($1::text IS NULL OR name = $1) AND ($2::text IS NULL OR day >= $2) ORDER BY day, name, model",
            name, since))
        return [{k: (int(v) if k in USAGE_FIELDS else v) for k, v in r.items()} for r in rows]

    async def close(self) -> None:
        """Closes the pool only when it is the store's own: a gateway's pool is shared and closed by the app."""
        if self.owns_database:
            await self.db.close()
