"""Versioned schemas: each component (responses, keys, ...) has its list of steps; the database records
how many of them it has applied (`schema_versions`). Two gateways starting at once against an empty
database both come up: the first to take the advisory lock migrates, the other waits for it and then
finds nothing left to do. A database migrated by a newer gateway (more steps than this one knows) is
left as it is: steps only ever add, so an older gateway of a rolling upgrade keeps working."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from gateway.database.pool import Database

log = logging.getLogger("enginegate.database")
LOCK_KEY = 0x656E67696E656761  # "enginega": pg_advisory_xact_lock's key for every schema change
VERSIONS_TABLE = """CREATE TABLE IF NOT EXISTS schema_versions (
    component text PRIMARY KEY,
    version int NOT NULL
)"""


async def migrate(db: Database, component: str, steps: Sequence[str], timeout_s: float | None = None) -> None:
    """Apply `steps` beyond the component's recorded version, in order, in one transaction (all or none)."""
    async with db.transaction(timeout_s) as conn:
        await conn.execute("SELECT pg_advisory_xact_lock($1)", LOCK_KEY)
        await conn.execute(VERSIONS_TABLE)
        version = await conn.fetchval("SELECT version FROM schema_versions WHERE component = $1", component) or 0
        if version > len(steps):
            log.warning("the %s schema in %s is at version %d, newer than this gateway's %d: left as it is",
                        component, db.describe(), version, len(steps))
            return
        for step in steps[version:]:
            await conn.execute(step)
        if version < len(steps):
            await conn.execute(
                "INSERT INTO schema_versions (component, version) VALUES ($1, $2) "
                "ON CONFLICT (component) DO UPDATE SET version = EXCLUDED.version", component, len(steps))
            log.info("migrated the %s schema in %s from version %d to %d", component, db.describe(), version, len(steps))
