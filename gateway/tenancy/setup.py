"""Tenancy from the settings: the store, the config file's static keys, and the spool file beside the
key store. The store: PostgreSQL when `database_url` is set (with `tenancy.redis_url` too, the limit
counters and leases in Redis and the rest in PostgreSQL), else Redis when `tenancy.redis_url` is set,
else the SQLite file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from gateway.config import Settings, StaticKey, TenancyConfig
from gateway.tenancy.keys import KeyPolicy, KeyRecord, hash_secret
from gateway.tenancy.metrics import LimitMetrics, TenancyMetrics
from gateway.tenancy.service import Tenancy
from gateway.tenancy.sqlite_store import SQLiteKeyStore, default_keys_path
from gateway.tenancy.store import KeyStore

if TYPE_CHECKING:  # asyncpg is an extra: imported only when database_url is set
    from gateway.database import Database

SPOOL_NAME = "usage-spool.jsonl"


def open_store(cfg: TenancyConfig, database: Database | None = None, owns_database: bool = False) -> KeyStore:
    """`database`: the process's pool to `database_url` (the gateway's, shared by its stores; closed by the
    store only when `owns_database`, as for `enginegate keys`)."""
    redis: KeyStore | None = None
    if cfg.redis_url:
        from gateway.tenancy.redis_store import RedisKeyStore

        redis = RedisKeyStore(cfg.redis_url, cfg.redis_prefix, cfg.store_timeout_seconds)
    if database is not None:
        from gateway.tenancy.postgres_store import PostgresKeyStore

        keys = PostgresKeyStore(database, owns_database=owns_database)
        if redis is None:
            return keys
        from gateway.tenancy.split_store import SplitKeyStore

        return SplitKeyStore(keys, redis)
    return redis or SQLiteKeyStore(cfg.path or default_keys_path())


def open_database(settings: Settings) -> Database | None:
    """A pool to `database_url` (None without it: SQLite files), connecting on first use: the gateway's one
    pool, shared by every store (app.py), or the CLI's own."""
    if settings.database_url is None:
        return None
    from gateway.database import Database

    return Database(settings.database_url, settings.tenancy.store_timeout_seconds)


def static_keys(keys: tuple[str | StaticKey, ...]) -> list[tuple[str, KeyRecord]]:
    """(secret, record) per config key; a plain string is a user key with no limits."""
    out: list[tuple[str, KeyRecord]] = []
    for key in keys:
        secret, policy, name = (key, KeyPolicy(), None) if isinstance(key, str) else (
            key.key, KeyPolicy.model_validate(key.model_dump(exclude={"key", "name"})), key.name)
        digest = hash_secret(secret)
        out.append((secret, KeyRecord(name or f"static-{digest[:8]}", digest, policy, 0.0, static=True)))
    names = [r.name for _, r in out]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"api_keys: the name {duplicates[0]!r} is used by more than one key")
    return out


def spool_path(cfg: TenancyConfig) -> Path:
    return (cfg.path or default_keys_path()).parent / SPOOL_NAME


def build_tenancy(settings: Settings, registry: CollectorRegistry | None = None,
                  database: Database | None = None) -> Tenancy:
    """`database`: the gateway's pool (app.state.database) when `database_url` is set."""
    cfg = settings.tenancy
    metrics = TenancyMetrics(registry) if cfg.key_metrics and registry is not None else None
    limit_metrics = LimitMetrics(registry) if registry is not None else None
    return Tenancy(open_store(cfg, database), static_keys(settings.api_keys), spool=spool_path(cfg),
                   on_store_error=cfg.on_store_error, metrics=metrics, allotments=cfg.allotments,
                   limit_metrics=limit_metrics)
