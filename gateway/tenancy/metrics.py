"""Prometheus counters by key name, only when the operator turns them on (`tenancy.key_metrics`):
one label value per key keeps the cardinality bounded by the number of keys; and, always served, where the limits
of keys were decided (no key label: nothing about a tenant)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from gateway.tenancy.store import UsageDelta


class TenancyMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter("enginegate_key_requests", "Requests by key and model (with tenancy.key_metrics: true).", ["key", "model"], registry=registry)
        self.tokens = Counter("enginegate_key_tokens", "Tokens by key, model and kind (prompt, completion; with tenancy.key_metrics: true).",
                              ["key", "model", "kind"], registry=registry)
        self.errors = Counter("enginegate_key_errors", "Failed requests by key and model (with tenancy.key_metrics: true).", ["key", "model"], registry=registry)
        self.rejections = Counter("enginegate_key_rejections",
                                  "Requests refused by a key's limits, by limit (with tenancy.key_metrics: true).",
                                  ["key", "model", "limit"], registry=registry)

    def settled(self, usage: UsageDelta) -> None:
        self.requests.labels(usage.name, usage.model).inc(usage.requests)
        self.tokens.labels(usage.name, usage.model, "prompt").inc(usage.prompt_tokens)
        self.tokens.labels(usage.name, usage.model, "completion").inc(usage.completion_tokens)
        if usage.errors:
            self.errors.labels(usage.name, usage.model).inc(usage.errors)

    def rejected(self, name: str, model: str, limit: str) -> None:
        self.rejections.labels(name, model, limit).inc()


class LimitMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = Counter("enginegate_limit_decisions",
                                 "Admissions of keys with limits, by where they were decided: gateway (from the key's "
                                 "allotment, no store round trip) or store (a reserve).", ["where"], registry=registry)
        self.granted = Counter("enginegate_limit_granted_requests",
                               "Requests the key store granted to this gateway's allotments ahead of need.",
                               registry=registry)
        self.in_gateway = self.decisions.labels("gateway")
        self.in_store = self.decisions.labels("store")
