"""Which sampler the settings ask for: a pure reading of OTEL_TRACES_SAMPLER / _ARG (or the config's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SamplerKind = Literal["always_on", "always_off", "traceidratio"]
SAMPLERS = ("always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off",
            "parentbased_traceidratio")
DEFAULT_SAMPLER = "parentbased_always_on"


class SamplerError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class SamplerSpec:
    kind: SamplerKind
    ratio: float = 1.0
    parent_based: bool = True
    """A sampled (or not) caller's trace decides for the gateway's spans too (W3C traceparent flags)."""


def sampler_spec(name: str | None, arg: str | float | None) -> SamplerSpec:
    """`name` and `arg` as OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG hold them (None: unset)."""
    chosen = (name or DEFAULT_SAMPLER).strip().lower()
    if chosen not in SAMPLERS:
        raise SamplerError(f"OTEL_TRACES_SAMPLER {name!r} is not one of {', '.join(SAMPLERS)}")
    parent_based = chosen.startswith("parentbased_")
    kind = chosen.removeprefix("parentbased_")
    ratio = 1.0
    if kind == "traceidratio" and arg is not None and arg != "":
        try:
            ratio = float(arg)
        except ValueError:
            raise SamplerError(f"OTEL_TRACES_SAMPLER_ARG {arg!r} is not a number between 0 and 1") from None
        if not 0.0 <= ratio <= 1.0:
            raise SamplerError(f"OTEL_TRACES_SAMPLER_ARG {arg!r} is not between 0 and 1")
    return SamplerSpec(kind, ratio, parent_based)  # type: ignore[arg-type]
