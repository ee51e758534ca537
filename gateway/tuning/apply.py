"""A plan with what this host's tune records say: one pure function, `apply_tuning(plan, tuning)`.

- The record for this host, model and workload: its results go into `plan.measured`; its winner's
  engine and options become the plan's (when the user named the engine, the best variant of that
  engine). The user's explicit settings are applied after this, so they still win and the plan
  lists where they differ (`apply_user`).
- The calibration for the plan's engine (from every usable record on this host): the capacity's
  decode and prefill predictions are replaced by calibrated ones; `plan.calibration` keeps the bounds.
- Notes (a stale record ignored, a record with no usable result) become plan warnings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.planning import Plan
from gateway.planning.measured import Measured, VariantResult
from gateway.tuning.calibrate import calibrate, engine_figures
from gateway.tuning.record import TuneRecord


@dataclass(frozen=True)
class Tuning:
    """What the tune cache holds for one plan (see lookup.py)."""

    record: TuneRecord | None = None
    path: str | None = None
    notes: tuple[str, ...] = ()
    usable: tuple[tuple[VariantResult, ...], ...] = ()
    """The results of every record that holds on this host (any model, any workload), newest first."""


def _figures(r: VariantResult) -> str:
    parts = []
    if r.decode_tokens_per_s:
        parts.append(f"{r.decode_tokens_per_s:.1f} tokens/s alone")
    if r.output_tokens_per_s and r.concurrency > 1:
        parts.append(f"{r.output_tokens_per_s:.1f} tokens/s at {r.concurrency} streams")
    if r.goodput_rps is not None:
        parts.append(f"goodput {r.goodput_rps:.2f} req/s")
    return ", ".join(parts) or "measured"


def apply_tuning(plan: Plan, tuning: Tuning) -> Plan:
    update: dict[str, object] = {}
    warnings = [*plan.warnings, *tuning.notes]
    record = tuning.record
    if record is not None:
        requested = plan.rule == "requested"
        pool = [r for r in record.results if r.ok and (not requested or r.engine == plan.engine)]
        winner = pool[0] if pool else None
        if winner is None:
            what = f"no working {plan.engine} variant" if requested else "no candidate that worked"
            warnings.append(f"tune record {tuning.path} ({record.created}) measured {what}: the plan stands as predicted")
        else:
            measured_n = sum(r.ok for r in record.results)
            lead = (f"measured on this host by `enginegate tune` ({record.created}): {winner.describe()} came first of "
                    f"{measured_n} measured ({_figures(winner)})")
            if winner.engine != plan.engine or winner.options != plan.options:
                lead += f"; the prediction was {plan.engine} with {_diff(plan.options, winner.options)}"
            update.update(engine=winner.engine, options=dict(winner.options), reasons=(lead, *plan.reasons),
                          rule=plan.rule if requested else "measured")
        update["measured"] = Measured(record=tuning.path or record.file_name(), created=record.created,
                                      results=record.results, winner=winner, taken=winner is not None)
    update["warnings"] = tuple(warnings)
    tuned = plan.model_copy(update=update)
    figures = engine_figures(tuned.engine, tuning.usable, tuned.options)
    return calibrate(tuned, figures) if figures is not None else tuned


def _diff(planned: Mapping[str, object], measured: Mapping[str, object]) -> str:
    changed = [f"{k}={planned.get(k)!r}" for k in sorted(set(planned) | set(measured)) if planned.get(k) != measured.get(k)]
    return ", ".join(changed) or "the same options"
