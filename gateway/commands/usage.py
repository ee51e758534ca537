"""`enginegate usage [--key K] [--since YYYY-MM-DD] [--json]`: requests, tokens, errors and engine
time per key, model and UTC day, from the key store the gateway writes."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("usage", help="usage per key, model and day (from the key store)")
    p.add_argument("--key", help="one key's name")
    p.add_argument("--since", help="from this UTC day on (YYYY-MM-DD)")
    p.add_argument("--config", help="the gateway's YAML config (its tenancy store)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import orjson

    from gateway.commands.keys import columns, with_store
    from gateway.tenancy.store import StoreUnavailable

    try:
        rows: list[dict[str, Any]] = with_store(args.config, lambda store: store.usage(args.key, args.since))
    except StoreUnavailable as exc:
        print(f"enginegate: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode())
        return 0
    table = [("DAY", "KEY", "MODEL", "REQUESTS", "PROMPT", "COMPLETION", "ERRORS", "REJECTED", "ENGINE_S")]
    for r in rows:
        table.append((r["day"], r["name"], r["model"], str(r["requests"]), str(r["prompt_tokens"]),
                      str(r["completion_tokens"]), str(r["errors"]), str(r["rejected"]), f"{r['engine_ms'] / 1000:.1f}"))
    print(columns(table))
    return 0
