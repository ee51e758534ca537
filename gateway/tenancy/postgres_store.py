"""The key store in the shared PostgreSQL database (`database_url`): keys, limits, leases and the
usage ledger of every gateway that names it.

Exactness: each `reserve` is decided in one call of the `tenancy_reserve_batch` function (one
statement: one transaction, one round trip) that first takes a transaction-scoped advisory lock on
the tenant (`pg_advisory_xact_lock`), then reads the tenant's counters, decides and charges; so the
reserves of one tenant are serialized across every gateway and no two of them both take the last
unit. Other tenants never wait for it. One tenant's counters are one state that every gateway must
see whole, so some serialization per tenant is the price of exact limits across gateways; what is
kept short is its turn: the reserves of a tenant that arrive in a gateway while one of its calls is
in flight wait in that gateway and go together in the next call (one lock turn, one read of the
counters and one write per counter for all of them, each decided in order as if alone), so a busy
key costs the database a call per round trip, not per request. The decision is `limits.check`'s rule in SQL, as the Redis store
has it in Lua (tests/unit/tenancy/test_postgres_store.py holds the two to each other).

Locks: every write to a tenant's rows (reserve, settle, renew, release_leases) first takes that
tenant's lock, and only `renew` takes several (in one order), so two writers never wait on each
other's row locks in a cycle: without it a settle and a reserve of one busy key deadlocked.

Time: windows, leases and the applied-ids table use the database's clock (`clock_timestamp()`),
one clock for every gateway whatever their own clocks say.

Key changes: a revoke or rotation sends `NOTIFY enginegate_keys` (the key's name) in its transaction,
delivered when it commits; `watch` listens on a connection of its own (asyncpg's add_listener), proved
alive by a `SELECT 1` every WATCH_PING_S, and counts it lost when it closes or a ping fails.

Schema: versioned with `migrate(db, "tenancy", STEPS)` on the store's first use (a gateway that
starts while the database is down comes up and migrates when it answers)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from gateway.tenancy.keys import KeyRecord
from gateway.tenancy.limits import Counters, Decision, Limits
from gateway.tenancy.store import (
    APPLIED_KEEP_MS,
    LEASE_TTL_MS,
    USAGE_FIELDS,
    Grant,
    KeyExists,
    KeysActive,
    Settlement,
    WATCH_DEAD_S,
    WATCH_PING_S,
    StoreUnavailable,
)

if TYPE_CHECKING:
    import asyncpg

    from gateway.database import Database

T = TypeVar("T")
COMPONENT = "tenancy"
LOCK_CLASS = 0x6B657973  # "keys": the first half of a tenant's advisory lock key (the second: hashtext(name))
CHANNEL = "enginegate_keys"
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
    # The limit decision, one call (one round trip): the tenant's lock, the counters as found, the rule of
    # limits.check (the same order; a test compares the two) and, when admitted, the charge: a window's
    # charge as sqlite_store's _add_window (an ended window starts again at now), a lease per request id.
    f"""
    CREATE FUNCTION tenancy_reserve(
        p_name text, p_request text, p_rpm bigint, p_tpm bigint, p_conc bigint, p_budget bigint,
        p_window bigint, p_period text, p_cost bigint, p_lease_ttl bigint,
        OUT o_refused text, OUT o_requests bigint, OUT o_requests_reset bigint, OUT o_tokens bigint,
        OUT o_tokens_reset bigint, OUT o_inflight bigint, OUT o_used bigint, OUT o_replay boolean)
    LANGUAGE plpgsql AS $$
    DECLARE
        now_ms bigint;
        w_started bigint;
        w_count bigint;
    BEGIN
        PERFORM pg_advisory_xact_lock({LOCK_CLASS}, hashtext(p_name));
        -- every statement from here takes a new snapshot: it sees what the lock's last holder committed
        now_ms := {NOW_MS};
        o_refused := NULL; o_requests := 0; o_requests_reset := 0; o_tokens := 0; o_tokens_reset := 0;
        o_inflight := 0; o_used := 0;
        o_replay := EXISTS (SELECT 1 FROM tenancy_applied WHERE id = 'r:' || p_request);
        IF p_rpm IS NOT NULL THEN
            SELECT started_ms, count INTO w_started, w_count FROM tenancy_windows WHERE name = p_name AND kind = 'requests';
            IF NOT FOUND OR now_ms - w_started >= p_window THEN
                o_requests_reset := p_window;
            ELSE
                o_requests := w_count; o_requests_reset := w_started + p_window - now_ms;
            END IF;
        END IF;
        IF p_tpm IS NOT NULL THEN
            SELECT started_ms, count INTO w_started, w_count FROM tenancy_windows WHERE name = p_name AND kind = 'tokens';
            IF NOT FOUND OR now_ms - w_started >= p_window THEN
                o_tokens_reset := p_window;
            ELSE
                o_tokens := w_count; o_tokens_reset := w_started + p_window - now_ms;
            END IF;
        END IF;
        IF p_conc IS NOT NULL THEN
            SELECT count(*) INTO o_inflight FROM tenancy_leases WHERE name = p_name AND expires_ms > now_ms;
        END IF;
        IF p_budget IS NOT NULL THEN
            SELECT COALESCE((SELECT b.used FROM tenancy_budgets b WHERE b.name = p_name AND b.period = p_period), 0)
                INTO o_used;
        END IF;
        IF o_replay THEN
            RETURN;  -- charged once already: admitted as it was
        END IF;
        IF p_rpm IS NOT NULL AND o_requests >= p_rpm THEN
            o_refused := 'requests';
        ELSIF p_tpm IS NOT NULL AND o_tokens > 0 AND o_tokens + p_cost > p_tpm THEN
            o_refused := 'tokens';
        ELSIF p_conc IS NOT NULL AND o_inflight >= p_conc THEN
            o_refused := 'concurrency';
        ELSIF p_budget IS NOT NULL AND o_used + p_cost > p_budget THEN
            o_refused := 'budget';
        END IF;
        IF o_refused IS NOT NULL THEN
            RETURN;
        END IF;
        IF p_rpm IS NOT NULL THEN
            INSERT INTO tenancy_windows AS w (name, kind, started_ms, count) VALUES (p_name, 'requests', now_ms, 1)
            ON CONFLICT (name, kind) DO UPDATE SET
                count = CASE WHEN now_ms - w.started_ms >= p_window THEN 1 ELSE w.count + 1 END,
                started_ms = CASE WHEN now_ms - w.started_ms >= p_window THEN now_ms ELSE w.started_ms END;
        END IF;
        IF p_tpm IS NOT NULL THEN
            INSERT INTO tenancy_windows AS w (name, kind, started_ms, count)
            VALUES (p_name, 'tokens', now_ms, GREATEST(p_cost, 0))
            ON CONFLICT (name, kind) DO UPDATE SET
                count = CASE WHEN now_ms - w.started_ms >= p_window THEN GREATEST(p_cost, 0)
                             ELSE GREATEST(w.count + p_cost, 0) END,
                started_ms = CASE WHEN now_ms - w.started_ms >= p_window THEN now_ms ELSE w.started_ms END;
        END IF;
        IF p_conc IS NOT NULL THEN
            DELETE FROM tenancy_leases WHERE name = p_name AND expires_ms <= now_ms;
            INSERT INTO tenancy_leases (name, request_id, expires_ms) VALUES (p_name, p_request, now_ms + p_lease_ttl)
            ON CONFLICT (name, request_id) DO UPDATE SET expires_ms = EXCLUDED.expires_ms;
        END IF;
        IF p_budget IS NOT NULL THEN
            INSERT INTO tenancy_budgets AS b (name, period, used) VALUES (p_name, p_period, GREATEST(p_cost, 0))
            ON CONFLICT (name, period) DO UPDATE SET used = GREATEST(b.used + p_cost, 0);
        END IF;
        INSERT INTO tenancy_applied (id, at_ms) VALUES ('r:' || p_request, now_ms) ON CONFLICT (id) DO NOTHING;
        o_requests := o_requests + 1; o_tokens := o_tokens + p_cost; o_inflight := o_inflight + 1;
        o_used := o_used + p_cost;
    END
    $$
    """,
    # One settlement, applied once (its id new in tenancy_applied), under the tenant's lock like a reserve:
    # every write to a tenant's rows (windows, budgets, leases, usage) is made holding that one lock, so two
    # writers never take two row locks in opposite orders (the settles of one tenant deadlocked without it).
    f"""
    CREATE FUNCTION tenancy_settle(
        p_name text, p_request text, p_release boolean, p_delta bigint, p_tpm boolean, p_budget boolean,
        p_window bigint, p_period text, p_usage_name text, p_model text, p_day text,
        {", ".join(f"p_{f} bigint" for f in USAGE_FIELDS)}) RETURNS boolean
    LANGUAGE plpgsql AS $$
    DECLARE
        now_ms bigint;
    BEGIN
        PERFORM pg_advisory_xact_lock({LOCK_CLASS}, hashtext(p_name));
        now_ms := {NOW_MS};
        INSERT INTO tenancy_applied (id, at_ms) VALUES ('s:' || p_request, now_ms) ON CONFLICT (id) DO NOTHING;
        IF NOT FOUND THEN
            RETURN false;  -- applied before (a replay after a timeout, or a spool written twice)
        END IF;
        IF p_release THEN
            DELETE FROM tenancy_leases WHERE name = p_name AND request_id = p_request;
        END IF;
        IF p_tpm AND p_delta <> 0 THEN
            INSERT INTO tenancy_windows AS w (name, kind, started_ms, count)
            VALUES (p_name, 'tokens', now_ms, GREATEST(p_delta, 0))
            ON CONFLICT (name, kind) DO UPDATE SET
                count = CASE WHEN now_ms - w.started_ms >= p_window THEN GREATEST(p_delta, 0)
                             ELSE GREATEST(w.count + p_delta, 0) END,
                started_ms = CASE WHEN now_ms - w.started_ms >= p_window THEN now_ms ELSE w.started_ms END;
        END IF;
        IF p_budget AND p_delta <> 0 THEN
            INSERT INTO tenancy_budgets AS b (name, period, used) VALUES (p_name, p_period, GREATEST(p_delta, 0))
            ON CONFLICT (name, period) DO UPDATE SET used = GREATEST(b.used + p_delta, 0);
        END IF;
        INSERT INTO tenancy_usage AS u (name, model, day, {", ".join(USAGE_FIELDS)})
        VALUES (p_usage_name, p_model, p_day, {", ".join(f"p_{f}" for f in USAGE_FIELDS)})
        ON CONFLICT (name, day, model) DO UPDATE SET
            {", ".join(f"{f} = u.{f} + EXCLUDED.{f}" for f in USAGE_FIELDS)};
        RETURN true;
    END
    $$
    """,
    # The reserve of a key that must still be active under the secret its request was authenticated with:
    # checked first, in the same transaction (a revoked or rotated key is refused 'revoked', charged nothing).
    """
    CREATE FUNCTION tenancy_reserve_key(
        p_secret text, p_name text, p_request text, p_rpm bigint, p_tpm bigint, p_conc bigint, p_budget bigint,
        p_window bigint, p_period text, p_cost bigint, p_lease_ttl bigint,
        OUT o_refused text, OUT o_requests bigint, OUT o_requests_reset bigint, OUT o_tokens bigint,
        OUT o_tokens_reset bigint, OUT o_inflight bigint, OUT o_used bigint, OUT o_replay boolean)
    LANGUAGE plpgsql AS $$
    BEGIN
        IF NOT EXISTS (SELECT 1 FROM tenancy_keys WHERE name = p_name AND secret_hash = p_secret) THEN
            o_refused := 'revoked'; o_requests := 0; o_requests_reset := 0; o_tokens := 0; o_tokens_reset := 0;
            o_inflight := 0; o_used := 0; o_replay := false;
            RETURN;
        END IF;
        SELECT * INTO o_refused, o_requests, o_requests_reset, o_tokens, o_tokens_reset, o_inflight, o_used, o_replay
        FROM tenancy_reserve(p_name, p_request, p_rpm, p_tpm, p_conc, p_budget, p_window, p_period, p_cost, p_lease_ttl);
    END
    $$
    """,
    # The reserves of one tenant queued in one gateway, decided in one call under one lock, in their order (each as
    # tenancy_reserve would, one after the other): the secret checked first (p_secret NULL: not checked), the
    # leases of ended requests (p_released) ended, the counters read once, one write per counter for the whole
    # batch. A row per request, in p_requests' order. The older functions stay for the gateways of a rolling upgrade.
    f"""
    CREATE FUNCTION tenancy_reserve_batch(
        p_secret text, p_name text, p_requests text[], p_costs bigint[], p_released text[], p_rpm bigint,
        p_tpm bigint, p_conc bigint, p_budget bigint, p_window bigint, p_period text, p_lease_ttl bigint)
    RETURNS TABLE (o_refused text, o_requests bigint, o_requests_reset bigint, o_tokens bigint,
                   o_tokens_reset bigint, o_inflight bigint, o_used bigint)
    LANGUAGE plpgsql AS $$
    DECLARE
        now_ms bigint;
        r_count bigint := 0; r_reset bigint := 0; t_count bigint := 0; t_reset bigint := 0;
        inflight bigint := 0; used bigint := 0;
        n_requests bigint := 0; n_tokens bigint := 0;
        w_started bigint; w_count bigint;
        replayed text[];
        admitted text[] := '{{}}';
        cost bigint;
    BEGIN
        IF p_secret IS NOT NULL AND NOT EXISTS (
                SELECT 1 FROM tenancy_keys WHERE name = p_name AND secret_hash = p_secret) THEN
            RETURN QUERY SELECT 'revoked'::text, 0::bigint, 0::bigint, 0::bigint, 0::bigint, 0::bigint, 0::bigint
                FROM unnest(p_requests);
            RETURN;
        END IF;
        PERFORM pg_advisory_xact_lock({LOCK_CLASS}, hashtext(p_name));
        now_ms := {NOW_MS};
        IF cardinality(p_released) > 0 THEN
            DELETE FROM tenancy_leases WHERE name = p_name AND request_id = ANY(p_released);
        END IF;
        SELECT COALESCE(array_agg(substr(id, 3)), '{{}}') INTO replayed FROM tenancy_applied
            WHERE id IN (SELECT 'r:' || x FROM unnest(p_requests) AS x);
        IF p_rpm IS NOT NULL THEN
            SELECT started_ms, count INTO w_started, w_count FROM tenancy_windows WHERE name = p_name AND kind = 'requests';
            IF NOT FOUND OR now_ms - w_started >= p_window THEN
                r_reset := p_window;
            ELSE
                r_count := w_count; r_reset := w_started + p_window - now_ms;
            END IF;
        END IF;
        IF p_tpm IS NOT NULL THEN
            SELECT started_ms, count INTO w_started, w_count FROM tenancy_windows WHERE name = p_name AND kind = 'tokens';
            IF NOT FOUND OR now_ms - w_started >= p_window THEN
                t_reset := p_window;
            ELSE
                t_count := w_count; t_reset := w_started + p_window - now_ms;
            END IF;
        END IF;
        IF p_conc IS NOT NULL THEN
            SELECT count(*) INTO inflight FROM tenancy_leases WHERE name = p_name AND expires_ms > now_ms;
        END IF;
        IF p_budget IS NOT NULL THEN
            SELECT COALESCE((SELECT b.used FROM tenancy_budgets b WHERE b.name = p_name AND b.period = p_period), 0)
                INTO used;
        END IF;
        FOR i IN 1 .. COALESCE(cardinality(p_requests), 0) LOOP
            cost := p_costs[i];
            o_refused := NULL; o_requests := r_count; o_requests_reset := r_reset; o_tokens := t_count;
            o_tokens_reset := t_reset; o_inflight := inflight; o_used := used;
            IF NOT p_requests[i] = ANY(replayed) THEN  -- a replay: charged once already, admitted as it was
                IF p_rpm IS NOT NULL AND r_count >= p_rpm THEN
                    o_refused := 'requests';
                ELSIF p_tpm IS NOT NULL AND t_count > 0 AND t_count + cost > p_tpm THEN
                    o_refused := 'tokens';
                ELSIF p_conc IS NOT NULL AND inflight >= p_conc THEN
                    o_refused := 'concurrency';
                ELSIF p_budget IS NOT NULL AND used + cost > p_budget THEN
                    o_refused := 'budget';
                END IF;
                IF o_refused IS NULL THEN
                    o_requests := o_requests + 1; o_tokens := o_tokens + cost; o_inflight := o_inflight + 1;
                    o_used := o_used + cost;
                    IF p_rpm IS NOT NULL THEN r_count := r_count + 1; END IF;
                    IF p_tpm IS NOT NULL THEN t_count := GREATEST(t_count + cost, 0); END IF;
                    IF p_conc IS NOT NULL THEN inflight := inflight + 1; END IF;
                    IF p_budget IS NOT NULL THEN used := GREATEST(used + cost, 0); END IF;
                    n_requests := n_requests + 1; n_tokens := n_tokens + cost;
                    admitted := admitted || p_requests[i];
                END IF;
            END IF;
            RETURN NEXT;
        END LOOP;
        IF n_requests = 0 THEN
            RETURN;
        END IF;
        IF p_rpm IS NOT NULL THEN
            INSERT INTO tenancy_windows AS w (name, kind, started_ms, count) VALUES (p_name, 'requests', now_ms, n_requests)
            ON CONFLICT (name, kind) DO UPDATE SET
                count = CASE WHEN now_ms - w.started_ms >= p_window THEN n_requests ELSE w.count + n_requests END,
                started_ms = CASE WHEN now_ms - w.started_ms >= p_window THEN now_ms ELSE w.started_ms END;
        END IF;
        IF p_tpm IS NOT NULL THEN
            INSERT INTO tenancy_windows AS w (name, kind, started_ms, count)
            VALUES (p_name, 'tokens', now_ms, GREATEST(n_tokens, 0))
            ON CONFLICT (name, kind) DO UPDATE SET
                count = CASE WHEN now_ms - w.started_ms >= p_window THEN GREATEST(n_tokens, 0)
                             ELSE GREATEST(w.count + n_tokens, 0) END,
                started_ms = CASE WHEN now_ms - w.started_ms >= p_window THEN now_ms ELSE w.started_ms END;
        END IF;
        IF p_conc IS NOT NULL THEN
            DELETE FROM tenancy_leases WHERE name = p_name AND expires_ms <= now_ms;
            INSERT INTO tenancy_leases (name, request_id, expires_ms)
            SELECT p_name, x, now_ms + p_lease_ttl FROM unnest(admitted) AS x
            ON CONFLICT (name, request_id) DO UPDATE SET expires_ms = EXCLUDED.expires_ms;
        END IF;
        IF p_budget IS NOT NULL THEN
            INSERT INTO tenancy_budgets AS b (name, period, used) VALUES (p_name, p_period, GREATEST(n_tokens, 0))
            ON CONFLICT (name, period) DO UPDATE SET used = GREATEST(b.used + n_tokens, 0);
        END IF;
        INSERT INTO tenancy_applied (id, at_ms) SELECT 'r:' || x, now_ms FROM unnest(admitted) AS x
        ON CONFLICT (id) DO NOTHING;
    END
    $$
    """,
    # A grant (store.py): the counters read once under the tenant's lock, each request decided in order as
    # tenancy_reserve_batch would (no lease, no applied id: a grant is never replayed), the total written once.
    f"""
    CREATE FUNCTION tenancy_grant(
        p_secret text, p_name text, p_want bigint, p_unit bigint, p_rpm bigint, p_tpm bigint, p_budget bigint,
        p_window bigint, p_period text)
    RETURNS TABLE (o_granted bigint, o_refused text, o_requests bigint, o_requests_reset bigint, o_tokens bigint,
                   o_tokens_reset bigint, o_used bigint)
    LANGUAGE plpgsql AS $$
    DECLARE
        now_ms bigint;
        r_count bigint := 0; r_reset bigint := 0; t_count bigint := 0; t_reset bigint := 0; used bigint := 0;
        w_started bigint; w_count bigint;
        n bigint := 0;
        refused text;
    BEGIN
        IF p_secret IS NOT NULL AND NOT EXISTS (
                SELECT 1 FROM tenancy_keys WHERE name = p_name AND secret_hash = p_secret) THEN
            RETURN QUERY SELECT 0::bigint, 'revoked'::text, 0::bigint, 0::bigint, 0::bigint, 0::bigint, 0::bigint;
            RETURN;
        END IF;
        PERFORM pg_advisory_xact_lock({LOCK_CLASS}, hashtext(p_name));
        now_ms := {NOW_MS};
        IF p_rpm IS NOT NULL THEN
            SELECT started_ms, count INTO w_started, w_count FROM tenancy_windows WHERE name = p_name AND kind = 'requests';
            IF NOT FOUND OR now_ms - w_started >= p_window THEN
                r_reset := p_window;
            ELSE
                r_count := w_count; r_reset := w_started + p_window - now_ms;
            END IF;
        END IF;
        IF p_tpm IS NOT NULL THEN
            SELECT started_ms, count INTO w_started, w_count FROM tenancy_windows WHERE name = p_name AND kind = 'tokens';
            IF NOT FOUND OR now_ms - w_started >= p_window THEN
                t_reset := p_window;
            ELSE
                t_count := w_count; t_reset := w_started + p_window - now_ms;
            END IF;
        END IF;
        IF p_budget IS NOT NULL THEN
            SELECT COALESCE((SELECT b.used FROM tenancy_budgets b WHERE b.name = p_name AND b.period = p_period), 0)
                INTO used;
        END IF;
        WHILE n < p_want LOOP
            IF p_rpm IS NOT NULL AND r_count + n >= p_rpm THEN
                refused := 'requests';
            ELSIF p_tpm IS NOT NULL AND t_count + n * p_unit > 0 AND t_count + (n + 1) * p_unit > p_tpm THEN
                refused := 'tokens';
            ELSIF p_budget IS NOT NULL AND used + (n + 1) * p_unit > p_budget THEN
                refused := 'budget';
            END IF;
            EXIT WHEN refused IS NOT NULL;
            n := n + 1;
        END LOOP;
        IF n > 0 THEN
            IF p_rpm IS NOT NULL THEN
                INSERT INTO tenancy_windows AS w (name, kind, started_ms, count) VALUES (p_name, 'requests', now_ms, n)
                ON CONFLICT (name, kind) DO UPDATE SET
                    count = CASE WHEN now_ms - w.started_ms >= p_window THEN n ELSE w.count + n END,
                    started_ms = CASE WHEN now_ms - w.started_ms >= p_window THEN now_ms ELSE w.started_ms END;
                r_count := r_count + n;
            END IF;
            IF p_tpm IS NOT NULL THEN
                INSERT INTO tenancy_windows AS w (name, kind, started_ms, count) VALUES (p_name, 'tokens', now_ms, n * p_unit)
                ON CONFLICT (name, kind) DO UPDATE SET
                    count = CASE WHEN now_ms - w.started_ms >= p_window THEN n * p_unit ELSE w.count + n * p_unit END,
                    started_ms = CASE WHEN now_ms - w.started_ms >= p_window THEN now_ms ELSE w.started_ms END;
                t_count := t_count + n * p_unit;
            END IF;
            IF p_budget IS NOT NULL THEN
                INSERT INTO tenancy_budgets AS b (name, period, used) VALUES (p_name, p_period, n * p_unit)
                ON CONFLICT (name, period) DO UPDATE SET used = b.used + n * p_unit;
                used := used + n * p_unit;
            END IF;
        END IF;
        RETURN QUERY SELECT n, refused, r_count, r_reset, t_count, t_reset, used;
    END
    $$
    """,
)
RESERVE_BATCH = "SELECT * FROM tenancy_reserve_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
"""The rows come back in p_requests' order (a set-returning plpgsql function returns them as made)."""
GRANT = "SELECT * FROM tenancy_grant($1, $2, $3, $4, $5, $6, $7, $8, $9)"
BATCH_MAX = 64
"""The most queued reserves of one tenant one call decides (more wait for the next call)."""

SET_AUTH = ("INSERT INTO tenancy_meta (key, value) VALUES ('auth', $1) "
            "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value")

SETTLE = f"SELECT tenancy_settle({', '.join(f'${i}' for i in range(1, 12 + len(USAGE_FIELDS)))})"
PRUNE_EVERY_S = 60.0
PRUNE = ("DELETE FROM tenancy_applied WHERE id IN (SELECT id FROM tenancy_applied WHERE at_ms < "
         f"{NOW_MS} - $1 ORDER BY at_ms LIMIT 10000 FOR UPDATE SKIP LOCKED)")
"""Forgets applied ids older than APPLIED_KEEP_MS, a bounded batch at a time, never waiting for a row
another gateway is pruning (every gateway prunes, at most once a minute)."""


_Group = tuple[str, str | None, int | None, int | None, int | None, int | None, int, str]
"""The reserves that may share one call: one tenant, one secret, the same limits."""


@dataclass(slots=True, eq=False)
class _Queued:
    request_id: str
    cost: int
    released: tuple[str, ...]
    limits: Limits
    decided: asyncio.Future[Decision]


def _record(raw: str | None) -> KeyRecord | None:
    return KeyRecord.from_json(orjson.loads(raw)) if raw else None


class PostgresKeyStore:
    def __init__(self, db: Database, lease_ttl_ms: int = LEASE_TTL_MS, owns_database: bool = False) -> None:
        self.db = db
        self.lease_ttl_ms = lease_ttl_ms
        self.owns_database = owns_database
        """True for a store with its own pool (`enginegate keys`); a gateway's stores share the app's."""
        self._migrated = False
        self._migrating = asyncio.Lock()
        self._pruned_at = -PRUNE_EVERY_S
        self._busy: set[_Group] = set()  # the groups with a reserve call in flight
        self._queued: dict[_Group, list[_Queued]] = {}  # the reserves waiting for the next call of their group
        self._drainers: set[asyncio.Task[None]] = set()

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
            await c.execute("SELECT pg_notify($1, $2)", CHANNEL, name)  # sent when this commits
            return record

        return await self._run(work, transaction=True)

    # -- limits ------------------------------------------------------------------------------
    async def reserve(self, name: str, limits: Limits, cost: int, request_id: str,
                      secret_hash: str | None = None, released: Sequence[str] = ()) -> Decision:
        """One call of `tenancy_reserve_batch`. While one is in flight for this tenant (and these limits), the
        reserves that come meanwhile queue and go together in the next call (BATCH_MAX at most): one round
        trip and one turn of the tenant's lock for all of them, each decided in its order as if alone. A
        queued reserve whose caller is cancelled before its call leaves is dropped; one already sent is
        charged (as a cancelled statement would be) and its lease expires unrenewed."""
        group = (name, secret_hash, limits.rpm, limits.tpm, limits.concurrency, limits.budget, limits.window_ms,
                 limits.budget_period)
        mine = _Queued(request_id, cost, tuple(released), limits, asyncio.get_running_loop().create_future())
        if group in self._busy:
            queue = self._queued.setdefault(group, [])
            queue.append(mine)
            try:
                return await asyncio.shield(mine.decided)
            except asyncio.CancelledError:
                if mine in queue:
                    queue.remove(mine)
                raise
        self._busy.add(group)
        try:
            await self._decide(group, [mine])
            return mine.decided.result()
        finally:
            self._next(group)

    async def grant(self, name: str, limits: Limits, requests: int, unit_cost: int,
                    secret_hash: str | None = None) -> Grant:
        """One call of `tenancy_grant`."""
        args = (secret_hash, name, requests, unit_cost, limits.rpm, limits.tpm, limits.budget, limits.window_ms,
                limits.budget_period)
        row = await self._run(lambda c: c.fetchrow(GRANT, *args))
        if row is None:
            raise StoreUnavailable(f"key store {self.describe()}: no answer to a grant of {requests}")
        granted = int(row[0])
        counters = Counters(int(row[2]), int(row[3]), int(row[4]), int(row[5]), 0, int(row[6]))
        return Grant(granted, Decision(limits, counters, None if granted else row[1]))

    def _next(self, group: _Group) -> None:
        """After a call of `group`: the reserves queued meanwhile go in a task of their own (no caller's
        cancellation stops it), else the group is free again."""
        if self._queued.get(group):
            self._drainers.add(task := asyncio.create_task(self._drain(group)))
            task.add_done_callback(self._drainers.discard)
        else:
            self._busy.discard(group)
            self._queued.pop(group, None)

    async def _drain(self, group: _Group) -> None:
        try:
            while queue := self._queued.get(group):
                batch, queue[:] = queue[:BATCH_MAX], queue[BATCH_MAX:]
                await self._decide(group, batch)
        finally:
            self._busy.discard(group)
            for q in self._queued.pop(group, []):  # stopped (the store closing): nobody is left waiting
                if not q.decided.done():
                    q.decided.set_exception(StoreUnavailable(f"key store {self.describe()}: closing"))

    async def _decide(self, group: _Group, batch: list[_Queued]) -> None:
        """Sets every reserve's decision, or its exception: never raises."""
        name, secret_hash, rpm, tpm, conc, budget, window_ms, period = group
        released = list(dict.fromkeys(r for q in batch for r in q.released))
        args = (secret_hash, name, [q.request_id for q in batch], [q.cost for q in batch], released, rpm, tpm, conc,
                budget, window_ms, period, self.lease_ttl_ms)
        try:
            rows = await self._run(lambda c: c.fetch(RESERVE_BATCH, *args))
            if len(rows) != len(batch):
                raise StoreUnavailable(f"key store {self.describe()}: {len(rows)} decisions for {len(batch)} reserves")
        except BaseException as exc:
            for q in batch:
                if not q.decided.done():
                    q.decided.set_exception(exc if isinstance(exc, Exception) else StoreUnavailable(str(exc) or "cancelled"))
                    q.decided.exception()  # retrieved: a caller that left never logs "exception never retrieved"
            if not isinstance(exc, Exception):
                raise
            return
        for q, row in zip(batch, rows):
            if not q.decided.done():
                counters = Counters(int(row[1]), int(row[2]), int(row[3]), int(row[4]), int(row[5]), int(row[6]))
                q.decided.set_result(Decision(q.limits, counters, row[0]))

    async def renew(self, leases: list[tuple[str, str]]) -> None:
        """One transaction that takes the locks of every tenant it renews, in one order (the lock keys'),
        as the only writer that holds more than one: no cycle with a reserve or a settle."""
        if not leases:
            return
        names, ids = [n for n, _ in leases], [r for _, r in leases]

        async def work(c: asyncpg.Connection) -> None:
            await c.execute(
                f"SELECT pg_advisory_xact_lock({LOCK_CLASS}, k) FROM "
                "(SELECT DISTINCT hashtext(n) AS k FROM unnest($1::text[]) AS n) AS t ORDER BY k", names)
            await c.execute(
                f"UPDATE tenancy_leases AS l SET expires_ms = {NOW_MS} + $3 FROM unnest($1::text[], $2::text[]) "
                f"AS x(name, id) WHERE l.name = x.name AND l.request_id = x.id AND l.expires_ms > {NOW_MS}",
                names, ids, self.lease_ttl_ms)

        await self._run(work, transaction=True)

    async def release_leases(self, name: str) -> int:
        async def work(c: asyncpg.Connection) -> int:
            await c.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", LOCK_CLASS, name)
            return int(await c.fetchval(
                f"WITH gone AS (DELETE FROM tenancy_leases WHERE name = $1 RETURNING expires_ms) "
                f"SELECT count(*) FROM gone WHERE expires_ms > {NOW_MS}", name))

        return await self._run(work, transaction=True)

    async def settle(self, settlements: list[Settlement]) -> None:
        """One round trip per tenant in the batch: that tenant's settlements in one transaction (asyncpg's
        executemany, pipelined), so a transaction never holds two tenants' locks at once (no cycle with a
        reserve or a renew). Each is applied once, so a batch cut short and replayed whole charges nothing
        twice."""
        if not settlements:
            return
        by_tenant: dict[str, list[tuple[Any, ...]]] = {}
        for s in settlements:
            by_tenant.setdefault(s.name, []).append(self._settle_args(s))

        async def work(c: asyncpg.Connection) -> None:
            for rows in by_tenant.values():
                if len(rows) == 1:
                    await c.execute(SETTLE, *rows[0])
                else:
                    await c.executemany(SETTLE, rows)
            now = time.monotonic()
            if now - self._pruned_at >= PRUNE_EVERY_S:
                self._pruned_at = now
                await c.execute(PRUNE, APPLIED_KEEP_MS)

        await self._run(work)

    @staticmethod
    def _settle_args(s: Settlement) -> tuple[Any, ...]:
        limits, u = s.limits, s.usage
        return (s.name, s.request_id, s.release, s.token_delta, bool(limits and limits.tpm),
                bool(limits and limits.budget), limits.window_ms if limits else 1, limits.budget_period if limits else "-",
                u.name, u.model, u.day, *(getattr(u, f) for f in USAGE_FIELDS))

    async def usage(self, name: str | None = None, since: str | None = None) -> list[dict[str, Any]]:
        rows = await self._run(lambda c: c.fetch(
            f"SELECT name, model, day, {', '.join(USAGE_FIELDS)} FROM tenancy_usage "
            "WHERE ($1::text IS NULL OR name = $1) AND ($2::text IS NULL OR day >= $2) ORDER BY day, name, model",
            name, since))
        return [{k: (int(v) if k in USAGE_FIELDS else v) for k, v in r.items()} for r in rows]

    async def watch(self, changed: Callable[[bool], None]) -> None:
        import asyncpg

        while True:
            conn: asyncpg.Connection | None = None
            live = False
            try:
                conn = await asyncpg.connect(self.db.url, timeout=self.db.timeout_s,
                                             server_settings={"application_name": "enginegate-keys-watch"})
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _, gone=lost: gone.set())  # this connection's event, never a later one's
                await conn.add_listener(CHANNEL, lambda *_: changed(True))
                live = True
                changed(True)
                while not lost.is_set():
                    try:
                        await asyncio.wait_for(lost.wait(), WATCH_PING_S)
                    except TimeoutError:
                        await conn.execute("SELECT 1", timeout=WATCH_DEAD_S)
            except (OSError, TimeoutError, ValueError, asyncpg.PostgresError, asyncpg.InterfaceError,
                    asyncpg.InternalClientError):
                pass
            finally:
                if live:
                    changed(False)
                if conn is not None:
                    conn.terminate()
            await asyncio.sleep(WATCH_PING_S)

    async def close(self) -> None:
        """Closes the pool only when it is the store's own: a gateway's pool is shared and closed by the app."""
        if self.owns_database:
            await self.db.close()
