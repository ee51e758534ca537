"""`enginegate models [list|load|unload MODEL]` against a running gateway's admin API."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import httpx

DEFAULT_URL = "http://127.0.0.1:8000"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("models", help="list, load or unload the models of a running gateway")
    p.add_argument("action", nargs="?", choices=("list", "load", "unload"), default="list")
    p.add_argument("model", nargs="?", help="the model id (for load and unload)")
    p.add_argument("--url", default=os.environ.get("ENGINEGATE_URL", DEFAULT_URL),
                   help=f"the gateway (default $ENGINEGATE_URL or {DEFAULT_URL})")
    p.add_argument("--api-key", default=os.environ.get("ENGINEGATE_API_KEY"), help="default $ENGINEGATE_API_KEY")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for a load or unload")
    p.set_defaults(func=run)


def _size(charges: dict[str, int] | None) -> str:
    if not charges:
        return "-"
    return " ".join(f"{pool} {n / 2**20:.0f} MiB" for pool, n in charges.items())


def _table(models: dict[str, Any]) -> str:
    rows = [("MODEL", "STATE", "ENGINE", "ESTIMATED", "MEASURED", "PIN", "NOTE")]
    for name, m in models.items():
        fp = m.get("footprint") or {}
        note = m.get("reason") or (fp.get("differs") and f"estimate off: {fp['differs']}") or ""
        if m.get("fallbacks"):
            note = (note + "; " if note else "") + "fell back from " + ", ".join(
                f"{f['engine']} ({f['reason']})" for f in m["fallbacks"])
        rows.append((name, m["state"], m.get("engine", ""), _size(fp.get("estimated_bytes")),
                     _size(fp.get("measured_bytes")), "yes" if m.get("pinned") else "", note))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows)


def run(args: argparse.Namespace) -> int:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    url = args.url.rstrip("/")
    if args.action != "list" and not args.model:
        print(f"enginegate models {args.action}: name the model", file=sys.stderr)
        return 2
    try:
        with httpx.Client(headers=headers, timeout=args.timeout) as client:
            if args.action == "list":
                r = client.get(f"{url}/admin/models")
            else:
                r = client.post(f"{url}/admin/models/{args.model}/{args.action}")
    except httpx.HTTPError as exc:
        print(f"enginegate models: cannot reach {url}: {exc}", file=sys.stderr)
        return 1
    body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
    if r.status_code != 200:
        message = body.get("error", {}).get("message") if isinstance(body, dict) else None
        print(f"enginegate models {args.action}: {r.status_code}: {message or r.text}", file=sys.stderr)
        return 1
    if args.action == "list":
        print(_table(body))
    else:
        print(_table({body.pop("model"): body}))
    return 0
