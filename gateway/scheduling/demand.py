"""What a request asks of admission: whose it is, its class, its share, its prompt, its deadline."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.identity import ServiceTier

TIERS: tuple[ServiceTier, ...] = ("priority", "default", "flex")
"""The service tiers (OpenAI's `service_tier`), highest first."""
RANK: dict[ServiceTier, int] = {tier: rank for rank, tier in enumerate(TIERS)}


@dataclass(frozen=True, slots=True)
class Demand:
    flow: str = ""
    """Whose request it is: the tenant (key name), else the flow header, else the client address."""
    tier: ServiceTier = "default"
    weight: float = 1.0
    """The flow's share relative to other flows' weights."""
    prompt_tokens: int = 0
    """The prompt's length (estimated before the engine sees it)."""
    deadline: float | None = None
    """Event-loop time by which the request must have left the queue; None: no deadline."""
    preemptible: bool = False
    """A stream the gateway can cut and resume from its text (gateway/preemption): it may borrow a kept slot."""
    resumed: bool = False
    """A preempted stream going on: first of its flow, never bounded, displaced or timed out, never cut again."""
