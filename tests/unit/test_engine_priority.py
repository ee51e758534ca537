"""A request's tier reaches engines that schedule by priority, and only those launched that way."""

from __future__ import annotations

from typing import Any

import pytest

from adapters import registry
from adapters.config import EngineConfig
from gateway.api.scheduling import with_engine_priority
from gateway.routing import Admission, Lease, Replica
from gateway.scheduling import Demand


def lease(engine: str, options: dict[str, Any]) -> Lease:
    adapter = registry.create(engine, EngineConfig(source="/nonexistent", name="m", options=options))
    return Lease(Replica(adapter, Admission()))


@pytest.mark.parametrize(("engine", "options", "body", "tier", "sent"), [
    ("vllm", {"scheduling_policy": "priority"}, {}, "priority", 0),
    ("vllm", {"scheduling_policy": "priority"}, {}, "default", 1),
    ("vllm", {"scheduling_policy": "priority"}, {}, "flex", 2),
    ("vllm", {"scheduling_policy": "priority"}, {"priority": -5}, "flex", -5),  # the client's own value is kept
    ("vllm", {}, {}, "priority", None),  # launched first come, first served: vLLM would refuse a priority
    ("openai", {"base_url": "http://127.0.0.1:9", "scheduling_policy": "priority"}, {}, "priority", None),
])
def test_priority_field(engine: str, options: dict[str, Any], body: dict[str, Any], tier: str, sent: int | None) -> None:
    out = with_engine_priority(body, lease(engine, options), Demand(tier=tier))  # type: ignore[arg-type]
    assert out.get("priority") == sent
