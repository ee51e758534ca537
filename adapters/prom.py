"""Engine Prometheus text -> the gateway's EngineStats names."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

from adapters.base import EngineStats

STAT_FIELDS = frozenset(EngineStats.__dataclass_fields__)


def sample_totals(text: str) -> dict[str, float]:
    """Every sample's value by sample name, summed over label sets (engines label by model, slot...)."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + float(sample.value)
    return totals


def engine_stats(text: str, mapping: Mapping[str, str]) -> EngineStats:
    """`mapping` names, for EngineStats fields, the engine's sample that reports each."""
    unknown = set(mapping) - STAT_FIELDS
    if unknown:
        raise ValueError(f"not EngineStats fields: {sorted(unknown)}")
    totals = sample_totals(text)
    return EngineStats(**{stat: totals[name] for stat, name in mapping.items() if name in totals})
