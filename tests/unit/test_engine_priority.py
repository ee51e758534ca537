"""A request's tier reaches engines that schedule by priority, and only those launched that way."""

from __future__ import annotations

from typing import Any

import pytest

from adapters import registry
from adapters.config import EngineConfig
from gateway.api.scheduling import with_engine_priority, within_ceiling
from gateway.identity import Caller
from gateway.routing import Admission, Lease, Replica
from gateway.scheduling import Demand


def lease(engine: str, options: dict[str, Any]) -> Lease:
    adapter = registry.create(engine, EngineConfig(source="/nonexistent", name="m", options=options))
    return Lease(Replica(adapter, Admission()))


@pytest.mark.parametrize(("engine", "options", "body", "tier", "sent"), [
    ("vllm", {"scheduling_policy": "priority"}, {}, "priority", 0),
    ("vllm", {"scheduling_policy": "priority"}, {}, "default", 1),
    ("vllm", {"scheduling_policy": "priority"}, {}, "flex", 2),
    # the client's own value is kept where it ranks the request no higher than its tier, else the tier's
    ("vllm", {"scheduling_policy": "priority"}, {"priority": 7}, "flex", 7),
    ("vllm", {"scheduling_policy": "priority"}, {"priority": 2}, "flex", 2),
    ("vllm", {"scheduling_policy": "priority"}, {"priority": -5}, "flex", 2),
    ("vllm", {"scheduling_policy": "priority"}, {"priority": 0}, "default", 1),
    ("vllm", {"scheduling_policy": "priority"}, {"priority": -1}, "priority", 0),
    ("vllm", {"scheduling_policy": "priority"}, {"priority": "0"}, "flex", 2),  # vLLM would read "0" as 0
    ("vllm", {"scheduling_policy": "priority"}, {"priority": 0.0}, "flex", 2),
    ("vllm", {"scheduling_policy": "priority"}, {"priority": False}, "flex", 2),
    ("vllm", {}, {}, "priority", None),  # launched first come, first served: vLLM would refuse a priority
    ("openai", {"base_url": "http://127.0.0.1:9", "scheduling_policy": "priority"}, {}, "priority", None),
])
def test_priority_field(engine: str, options: dict[str, Any], body: dict[str, Any], tier: str, sent: int | None) -> None:
    out = with_engine_priority(body, lease(engine, options), Demand(tier=tier))  # type: ignore[arg-type]
    assert out.get("priority") == sent


FLEX = Caller("team", service_tier="flex")


@pytest.mark.parametrize(("body", "caller", "tier", "sent"), [
    # without keys the body goes as it came
    ({"service_tier": "priority", "priority": -9}, None, "priority", {"service_tier": "priority", "priority": -9}),
    # a tier above the key's ceiling (or one the gateway does not know) is the tier it is served at
    ({"service_tier": "priority"}, FLEX, "flex", {"service_tier": "flex"}),
    ({"service_tier": "default"}, FLEX, "flex", {"service_tier": "flex"}),
    ({"service_tier": "auto"}, FLEX, "flex", {"service_tier": "flex"}),
    ({"service_tier": "scale"}, Caller("k"), "default", {"service_tier": "default"}),
    ({"service_tier": "priority"}, Caller("k"), "default", {"service_tier": "default"}),
    ({"service_tier": "flex"}, Caller("k"), "flex", {"service_tier": "flex"}),  # asking less is kept
    ({}, FLEX, "flex", {}),  # naming none: nothing added
    # the client's own engine priority is dropped unless the key may use priority
    ({"priority": -100}, FLEX, "flex", {}),
    ({"priority": 5}, Caller("k"), "default", {}),
    ({"service_tier": "auto", "priority": -1}, Caller("k", service_tier="priority"), "priority",
     {"service_tier": "auto", "priority": -1}),
])
def test_the_body_an_engine_gets_never_claims_more_than_the_key_allows(
        body: dict[str, Any], caller: Caller | None, tier: str, sent: dict[str, Any]) -> None:
    assert within_ceiling(body, Demand(tier=tier), caller) == sent  # type: ignore[arg-type]
