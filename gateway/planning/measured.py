"""What `enginegate tune` measured, as a plan carries it: results next to predictions, and the calibration.

Data only: `gateway/tuning` measures, stores and applies; the planner never reads the cache itself.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Status = Literal["ok", "failed", "not_installed", "skipped"]


class VariantResult(BaseModel):
    """One engine with one set of options, started and measured on this host (or why not)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    engine: str
    label: str
    """Its main options, e.g. `threads=2 parallel=1`, marked `(planned)` for the plan's own."""
    options: dict[str, Any] = Field(default_factory=dict)
    status: Status = "ok"
    reason: str | None = None
    load_s: float | None = None
    decode_tokens_per_s: float | None = None
    """One sequence alone: 1 / TPOT p50 at concurrency 1."""
    prefill_s: float | None = None
    """TTFT p50 at concurrency 1 (the prompt's prefill plus the gateway's own few ms)."""
    concurrency: int = 1
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p99_s: float | None = None
    output_tokens_per_s: float | None = None
    request_rate: float | None = None
    goodput_rps: float | None = None
    goodput_fraction: float | None = None
    errors: dict[str, int] = Field(default_factory=dict)
    peak_memory_bytes: int | None = None
    """Peak resident memory of the gateway and its engine processes together."""
    predicted_decode_tokens_per_s: float | None = None
    """The planner's uncalibrated bound for this engine here."""
    predicted_prefill_s: float | None = None
    predicted_aggregate_tokens_per_s: float | None = None
    """The planner's uncalibrated bound on tokens/s summed over `concurrency` streams."""
    bytes_per_token: int | None = None
    prompt_tokens: int | None = None
    params_active: int | None = None
    wall_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def describe(self) -> str:
        return f"{self.engine} {self.label}"


class Measured(BaseModel):
    """The tune record that matched this plan: every result, ranked, and whether the plan took the winner."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    record: str
    """The record's file."""
    created: str
    results: tuple[VariantResult, ...]
    winner: VariantResult | None = None
    """The best measured variant the plan may take (of the requested engine when the user named one)."""
    taken: bool = False
    """The plan's engine and options are the winner's (the user's explicit settings still win over them)."""


class Calibration(BaseModel):
    """The planner's speed predictions for one engine on this host, scaled by what tune records measured.

    Decode: an effective bandwidth (measured tokens/s x bytes read per token) replaces the datasheet or
    copy-test one; prefill: an effective FLOP rate (2 x active params x prompt tokens / measured prefill).
    Both carry over to other models and workloads on the same host and engine version.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    engine: str
    records: int
    effective_bandwidth_gbps: float | None = None
    bound_decode_tokens_per_s: float | None = None
    """The uncalibrated bound this plan had."""
    decode_tokens_per_s: float | None = None
    aggregate_share: float | None = None
    """Measured tokens/s over several streams / the planner's aggregate bound for them (None: not measured)."""
    bound_aggregate_tokens_per_s: float | None = None
    aggregate_tokens_per_s: float | None = None
    effective_prefill_tflops: float | None = None
    bound_prefill_s: float | None = None
    prefill_s: float | None = None

    def describe(self) -> str:
        parts = []
        if self.decode_tokens_per_s is not None:
            bound = (f", {self.decode_tokens_per_s / self.bound_decode_tokens_per_s:.2f} x the uncalibrated bound "
                     f"{self.bound_decode_tokens_per_s:.1f}") if self.bound_decode_tokens_per_s else ""
            parts.append(f"decode ~{self.decode_tokens_per_s:.1f} tokens/s per sequence "
                         f"({self.effective_bandwidth_gbps:.2f} GB/s effective{bound})")
        if self.aggregate_tokens_per_s is not None:
            share = f", {self.aggregate_share:.2f} x the bound" if self.aggregate_share is not None else ""
            parts.append(f"~{self.aggregate_tokens_per_s:.1f} tokens/s over several streams{share}")
        if self.prefill_s is not None:
            bound = f", uncalibrated {self.bound_prefill_s * 1000:.0f} ms" if self.bound_prefill_s else ""
            parts.append(f"prefill ~{self.prefill_s * 1000:.0f} ms ({self.effective_prefill_tflops:.3f} TFLOP/s "
                         f"effective{bound})")
        return (f"{self.engine} on this host, from {self.records} tune record(s): " + "; ".join(parts)
                if parts else f"{self.engine}: no usable measurement")
