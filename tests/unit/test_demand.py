"""A request's demand from its key, headers, body and address; its prompt's estimated length."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config import FlowConfig
from gateway.identity import Caller
from gateway.scheduling.classify import DEADLINE_HEADER, DemandError, demand_for, tier_of
from gateway.scheduling.prompt import prompt_tokens

FLOWS = FlowConfig(weights={"batch": 0.5, "team-a": 3.0})


@pytest.mark.parametrize(("body", "headers", "caller", "expected"), [
    # no key: the flow header, else the client address; tier default
    ({}, {}, None, ("10.0.0.9", "default", 1.0)),
    ({}, {"x-enginegate-flow": "batch"}, None, ("batch", "default", 0.5)),
    # the body's service_tier beats the header, which beats the key's default (tier_of's table below)
    ({"service_tier": "flex"}, {"x-enginegate-service-tier": "priority"}, Caller("k", service_tier="default"),
     ("k", "flex", 1.0)),
    ({"service_tier": "auto"}, {}, Caller("k", service_tier="flex"), ("k", "flex", 1.0)),
    # a key names the flow (the header is ignored); its own weight wins over the config's
    ({}, {"x-enginegate-flow": "batch"}, Caller("team-a"), ("team-a", "default", 3.0)),
    ({}, {}, Caller("team-a", weight=2.0), ("team-a", "default", 2.0)),
])
def test_flow_tier_and_weight(body: dict[str, Any], headers: dict[str, str], caller: Caller | None,
                              expected: tuple[str, str, float]) -> None:
    d = demand_for(body, headers, caller, "10.0.0.9", FLOWS, now=100.0)
    assert (d.flow, d.tier, d.weight) == expected and d.deadline is None


TIER = "x-enginegate-service-tier"


@pytest.mark.parametrize(("body", "headers", "caller", "tier"), [
    # no keys: whatever the request asks (body first, then the header), else default
    ({}, {}, None, "default"),
    ({"service_tier": "priority"}, {}, None, "priority"),
    ({}, {TIER: "Priority "}, None, "priority"),
    ({"service_tier": "flex"}, {TIER: "priority"}, None, "flex"),
    ({"service_tier": "auto"}, {TIER: "priority"}, None, "priority"),  # auto defers to the next source
    ({"service_tier": "scale"}, {}, None, "default"),  # unknown too
    # a key's tier is its ceiling: a request may ask less, never more (it is served at the ceiling)
    ({"service_tier": "priority"}, {}, Caller("k", service_tier="flex"), "flex"),
    ({}, {TIER: "priority"}, Caller("k", service_tier="flex"), "flex"),
    ({"service_tier": "default"}, {}, Caller("k", service_tier="flex"), "flex"),
    ({"service_tier": "auto"}, {TIER: "priority"}, Caller("k", service_tier="flex"), "flex"),
    ({"service_tier": "priority"}, {}, Caller("k", service_tier="default"), "default"),
    ({"service_tier": "flex"}, {}, Caller("k", service_tier="default"), "flex"),
    # ... and its tier when the request names none
    ({}, {}, Caller("k", service_tier="flex"), "flex"),
    ({}, {}, Caller("k", service_tier="priority"), "priority"),
    # a key given priority may use every tier
    ({"service_tier": "flex"}, {}, Caller("k", service_tier="priority"), "flex"),
    ({}, {TIER: "default"}, Caller("k", service_tier="priority"), "default"),
    ({"service_tier": "priority"}, {}, Caller("k", service_tier="priority"), "priority"),
    # a key given no tier: default is its ceiling (only keys given priority may use priority), admins too
    ({}, {}, Caller("k"), "default"),
    ({"service_tier": "priority"}, {}, Caller("k"), "default"),
    ({}, {TIER: "priority"}, Caller("ops", role="admin"), "default"),
    ({"service_tier": "flex"}, {}, Caller("k"), "flex"),
])
def test_a_keys_tier_is_a_ceiling(body: dict[str, Any], headers: dict[str, str], caller: Caller | None,
                                  tier: str) -> None:
    assert tier_of(body, headers, caller, FLOWS) == tier


def test_a_header_naming_no_tier_is_refused_even_under_a_ceiling() -> None:
    with pytest.raises(DemandError):
        tier_of({}, {TIER: "urgent"}, Caller("k", service_tier="flex"), FLOWS)


def test_deadline_header_is_relative_milliseconds() -> None:
    assert demand_for({}, {DEADLINE_HEADER: "250"}, None, None, FLOWS, now=100.0).deadline == pytest.approx(100.25)


@pytest.mark.parametrize(("headers", "named"), [
    ({DEADLINE_HEADER: "soon"}, DEADLINE_HEADER),
    ({DEADLINE_HEADER: "-5"}, DEADLINE_HEADER),
    ({DEADLINE_HEADER: "inf"}, DEADLINE_HEADER),
    ({"x-enginegate-service-tier": "urgent"}, "x-enginegate-service-tier"),
])
def test_unreadable_headers_name_themselves(headers: dict[str, str], named: str) -> None:
    with pytest.raises(DemandError) as err:
        demand_for({}, headers, None, None, FLOWS, now=0.0)
    assert err.value.header == named


@pytest.mark.parametrize(("body", "tokens"), [
    ({"messages": [{"role": "user", "content": "x" * 400}]}, 133),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x" * 40}]}]}, 43),
    ({"prompt": [1, 2, 3]}, 4),
    ({"prompt": [[1, 2], [3]]}, 5),
    ({"prompt": "abcdefgh"}, 3),
    ({"input": "abcd", "instructions": "abcd"}, 9),
    ({}, 0),
])
def test_prompt_tokens_estimate(body: dict[str, Any], tokens: int) -> None:
    assert prompt_tokens(body) == tokens
