"""`enginegate keys create|list|revoke|rotate|release-leases|auth-off`: the key store the gateway reads (the
same PostgreSQL database, file or Redis as `serve` with the same config and environment, ENGINEGATE_DATABASE_URL
included; no config: $XDG_DATA_HOME/enginegate/keys.sqlite3). Against PostgreSQL the command opens its own
pool and migrates the schema when it is new."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import date, datetime
from typing import Any, TypeVar

import orjson
from pydantic import ValidationError

T = TypeVar("T")


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("keys", help="create, list, revoke or rotate API keys (printed once, stored hashed); reset slots; turn auth off")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser("create", help="a new key: its secret is printed once")
    create.add_argument("name", help="the tenant name (usage, limits and fair scheduling use it)")
    create.add_argument("--role", choices=("user", "admin"), default="user")
    create.add_argument("--models", help="comma-separated model ids the key may use (default: every model)")
    create.add_argument("--rpm", type=int, help="requests per window (a minute unless --window-seconds)")
    create.add_argument("--tpm", type=int, help="tokens per window")
    create.add_argument("--max-concurrency", type=int, help="requests running at once")
    create.add_argument("--budget-tokens", type=int, help="tokens per budget period")
    create.add_argument("--budget-period", choices=("day", "month"), default="month")
    create.add_argument("--window-seconds", type=float, help="the rpm/tpm window (default 60)")
    create.add_argument("--expires", help="YYYY-MM-DD (end of that day, UTC) or an ISO time")
    create.add_argument("--weight", type=float, help="share in fair scheduling (default 1)")
    create.add_argument("--service-tier", choices=("priority", "default", "flex"),
                        help="the highest priority class the key's requests may use, and theirs when they name "
                             "none; a request may ask for less, never more (default: default, so only keys "
                             "given priority may use it)")
    for name, text in (("list", "every key (no secrets)"), ("revoke", "the key stops working at once"),
                       ("rotate", "a new secret for the same name"),
                       ("release-leases", "end every concurrency slot the key holds (an admin reset)"),
                       ("auth-off", "turn authentication off again (every key in the store must be revoked first)")):
        sub = actions.add_parser(name, help=text)
        if name not in ("list", "auth-off"):
            sub.add_argument("name")
    for sub in actions.choices.values():
        sub.add_argument("--config", help="the gateway's YAML config (its tenancy store)")
        sub.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def with_store(config: str | None, work: Callable[[Any], Awaitable[T]]) -> T:
    from gateway.config import load_settings
    from gateway.tenancy.setup import open_database, open_store

    settings = load_settings(config)

    async def go() -> T:
        store = open_store(settings.tenancy, open_database(settings), owns_database=True)
        try:
            return await work(store)
        finally:
            await store.close()

    return asyncio.run(go())


def _policy(args: argparse.Namespace) -> dict[str, Any]:
    fields: dict[str, Any] = {"role": args.role, "budget_period": args.budget_period}
    if args.models:
        fields["models"] = tuple(m.strip() for m in args.models.split(",") if m.strip())
    for name in ("rpm", "tpm", "max_concurrency", "budget_tokens", "window_seconds", "weight", "service_tier"):
        if getattr(args, name) is not None:
            fields[name] = getattr(args, name)
    if args.expires:
        fields["expires"] = date.fromisoformat(args.expires) if len(args.expires) == 10 else datetime.fromisoformat(args.expires)
    return fields


def run(args: argparse.Namespace) -> int:
    from gateway.tenancy.keys import KeyPolicy, new_record, rotated
    from gateway.tenancy.store import KeyExists, KeysActive, StoreUnavailable

    try:
        if args.action == "create":
            record, secret = new_record(args.name, KeyPolicy.model_validate(_policy(args)))

            async def create(store: Any) -> None:
                await store.create(record)

            with_store(args.config, create)
            return _print({**record.public(), "key": secret}, args.json,
                          f"created key {record.name} ({record.policy.role}); its secret, shown only now:\n{secret}")
        if args.action == "list":
            records = with_store(args.config, lambda store: store.list())
            rows = [r.public() for r in records]
            return _print(rows, args.json, _table(rows))
        if args.action == "revoke":
            revoked = with_store(args.config, lambda store: store.revoke(args.name, time.time()))
            if revoked is None:
                print(f"enginegate: no active key named {args.name}", file=sys.stderr)
                return 1
            return _print(revoked.public(), args.json, f"revoked {args.name}: it fails on its next request")
        if args.action == "release-leases":
            released = with_store(args.config, lambda store: store.release_leases(args.name))
            return _print({"name": args.name, "released": released}, args.json,
                          f"released {released} concurrency slot(s) of {args.name}")
        if args.action == "auth-off":
            with_store(args.config, lambda store: store.disable_auth())
            return _print({"auth_enabled": False}, args.json,
                          "authentication is off: with no key in the config file, every route of the gateway is open "
                          "(within a second); `keys create` turns it on again")

        async def rotate(store: Any) -> tuple[Any, str] | None:
            current = await store.get(args.name)
            if current is None or current.revoked_at is not None:
                return None
            record, secret = rotated(current)
            return (record, secret) if await store.replace_secret(args.name, record.secret_hash) else None

        done = with_store(args.config, rotate)
        if done is None:
            print(f"enginegate: no active key named {args.name}", file=sys.stderr)
            return 1
        return _print({**done[0].public(), "key": done[1]}, args.json,
                      f"rotated {args.name}; the old secret no longer works. The new one, shown only now:\n{done[1]}")
    except KeyExists:
        print(f"enginegate: a key named {args.name} exists (revoke or rotate it)", file=sys.stderr)
        return 1
    except KeysActive as exc:
        print(f"enginegate: the key {exc} is active: revoke every key first (`enginegate keys list`)", file=sys.stderr)
        return 1
    except StoreUnavailable as exc:
        print(f"enginegate: {exc}", file=sys.stderr)
        return 1
    except (ValidationError, ValueError) as exc:
        print(f"enginegate: invalid key: {exc}", file=sys.stderr)
        return 2


def _print(data: Any, as_json: bool, text: str) -> int:
    print(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() if as_json else text)
    return 0


def _limits(row: dict[str, Any]) -> str:
    parts = [f"{k}={row[k]}" for k in ("rpm", "tpm", "max_concurrency") if row.get(k)]
    if row.get("budget_tokens"):
        parts.append(f"budget={row['budget_tokens']}/{row['budget_period']}")
    if row.get("window_seconds") != 60.0:
        parts.append(f"window={row['window_seconds']:g}s")
    return " ".join(parts) or "-"


def _table(rows: list[dict[str, Any]]) -> str:
    table = [("NAME", "ROLE", "STATE", "MODELS", "LIMITS", "SOURCE")]
    for r in rows:
        state = "revoked" if r["revoked_at"] else ("active" if r["active"] else "expired")
        table.append((r["name"], r["role"], state, ",".join(r["models"]) or "*", _limits(r), "config" if r["static"] else "store"))
    return columns(table)


def columns(table: list[tuple[str, ...]]) -> str:
    """Rows as left-aligned columns (the first row is the header)."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table)
