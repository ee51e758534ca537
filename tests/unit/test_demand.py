"""A request's demand from its key, headers, body and address; its prompt's estimated length."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config import FlowConfig
from gateway.identity import Caller
from gateway.scheduling.classify import DEADLINE_HEADER, DemandError, demand_for
from gateway.scheduling.prompt import prompt_tokens

FLOWS = FlowConfig(weights={"batch": 0.5, "team-a": 3.0})


@pytest.mark.parametrize(("body", "headers", "caller", "expected"), [
    # no key: the flow header, else the client address; tier default
    ({}, {}, None, ("10.0.0.9", "default", 1.0)),
    ({}, {"x-enginegate-flow": "batch"}, None, ("batch", "default", 0.5)),
    # the body's service_tier beats the header, which beats the key's default
    ({"service_tier": "flex"}, {"x-enginegate-service-tier": "priority"}, Caller("k", service_tier="default"),
     ("k", "flex", 1.0)),
    ({}, {"x-enginegate-service-tier": "Priority"}, Caller("k", service_tier="flex"), ("k", "priority", 1.0)),
    ({"service_tier": "auto"}, {}, Caller("k", service_tier="flex"), ("k", "flex", 1.0)),
    # a key names the flow (the header is ignored); its own weight wins over the config's
    ({}, {"x-enginegate-flow": "batch"}, Caller("team-a"), ("team-a", "default", 3.0)),
    ({}, {}, Caller("team-a", weight=2.0), ("team-a", "default", 2.0)),
])
def test_flow_tier_and_weight(body: dict[str, Any], headers: dict[str, str], caller: Caller | None,
                              expected: tuple[str, str, float]) -> None:
    d = demand_for(body, headers, caller, "10.0.0.9", FLOWS, now=100.0)
    assert (d.flow, d.tier, d.weight) == expected and d.deadline is None


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
