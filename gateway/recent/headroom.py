"""How close a tenant is to its limits: a pure function of its key's policy and the counters its last
request through this gateway found (the store's counters after that request's charge).

A window or budget period that has ended since counts as empty again; concurrency is as it was at that
admission (the request itself included). No request seen yet: every limit is shown, nothing used."""

from __future__ import annotations

from typing import Any

from gateway.recent.ring import LimitsSeen
from gateway.tenancy.keys import KeyPolicy


def headroom(name: str, policy: KeyPolicy, seen: LimitsSeen | None, now: float) -> dict[str, Any]:
    limits = {"rpm": policy.rpm, "tpm": policy.tpm, "concurrency": policy.max_concurrency,
              "budget": policy.budget_tokens}
    used: dict[str, int | None] = dict.fromkeys(limits)
    resets: dict[str, float | None] = dict.fromkeys(limits)
    if seen is not None:
        c = seen.decision.counters
        age_ms = max(0.0, (now - seen.at) * 1000)
        live_requests = age_ms < c.requests_reset_ms
        live_tokens = age_ms < c.tokens_reset_ms
        live_budget = age_ms < seen.decision.limits.budget_reset_ms
        used = {"rpm": c.requests if live_requests else 0, "tpm": c.tokens if live_tokens else 0,
                "concurrency": c.inflight, "budget": c.budget_used if live_budget else 0}
        resets = {"rpm": round(c.requests_reset_ms - age_ms) if live_requests else None,
                  "tpm": round(c.tokens_reset_ms - age_ms) if live_tokens else None, "concurrency": None,
                  "budget": round(seen.decision.limits.budget_reset_ms - age_ms) if live_budget else None}
    out: dict[str, Any] = {}
    for field, limit in limits.items():
        got = used[field] if limit is not None else None
        out[field] = {"limit": limit, "used": got if seen is not None else None,
                      "ratio": round(got / limit, 4) if limit and got is not None else None,
                      "resets_in_ms": resets[field] if limit is not None else None}
    return {"tenant": name, "role": policy.role, "window_seconds": policy.window_seconds,
            "budget_period": policy.budget_period, "seen_at": seen.at if seen is not None else None,
            "refused": seen.decision.refused if seen is not None else None, "limits": out}
