"""apply_tuning: the measured winner's engine and options, the user's settings over them, calibrated speed."""

from __future__ import annotations

import pytest

from gateway.planning import apply_user
from gateway.tuning import Tuning, apply_tuning
from gateway.planning import Workload
from tests.unit.tuning.helpers import SNAPSHOT, planned, record, result


def test_the_plan_takes_the_measured_winner() -> None:
    base = planned()
    assert base.engine == "llama_server"  # two streams: the prediction is llama-server with slots
    inproc = planned("llamacpp").options
    rec = record([result("llama_server", base.options, goodput=1.0), result("llamacpp", inproc, goodput=3.0)])
    tuned = apply_tuning(base, Tuning(record=rec, path="r.json", usable=(rec.results,)))
    assert tuned.engine == "llamacpp" and tuned.options == inproc
    assert tuned.rule == "measured"
    assert "enginegate tune" in tuned.reasons[0] and "the prediction was llama_server" in tuned.reasons[0]
    assert tuned.reasons[1:] == base.reasons
    assert tuned.measured is not None and tuned.measured.taken
    assert tuned.measured.winner is not None and tuned.measured.winner.engine == "llamacpp"
    assert [r.engine for r in tuned.measured.results] == ["llamacpp", "llama_server"]


def test_the_users_explicit_settings_still_win_and_are_listed() -> None:
    base = planned()
    winner = {**base.options, "threads": 2}
    rec = record([result("llama_server", winner, goodput=2.0)])
    tuned = apply_tuning(base, Tuning(record=rec, path="r.json"))
    final = apply_user(tuned, {"threads": 1}, SNAPSHOT)
    assert final.options["threads"] == 1
    assert [(o.option, o.planned, o.chosen) for o in final.overridden] == [("threads", 2, 1)]


def test_a_requested_engine_stays_and_takes_its_own_best_variant() -> None:
    base = planned("llama_server")
    assert base.rule == "requested"
    faster_other = result("llamacpp", planned("llamacpp").options, goodput=5.0)
    own = result("llama_server", {**base.options, "threads": 2}, goodput=2.0)
    rec = record([faster_other, own, result("llama_server", base.options, goodput=1.0)])
    tuned = apply_tuning(base, Tuning(record=rec, path="r.json"))
    assert tuned.engine == "llama_server" and tuned.options["threads"] == 2
    assert tuned.rule == "requested"


def test_a_record_with_nothing_that_worked_leaves_the_prediction_and_says_so() -> None:
    base = planned()
    rec = record([result("llama_server", base.options, goodput=0, status="failed")])
    tuned = apply_tuning(base, Tuning(record=rec, path="r.json", usable=(rec.results,)))
    assert tuned.engine == base.engine and tuned.options == base.options
    assert tuned.measured is not None and not tuned.measured.taken
    assert any("measured no candidate that worked" in w for w in tuned.warnings)
    assert tuned.calibration is None


def test_notes_become_warnings() -> None:
    base = planned()
    tuned = apply_tuning(base, Tuning(notes=("tune record x ignored: other hardware",)))
    assert tuned.warnings[-1] == "tune record x ignored: other hardware"
    assert tuned.measured is None


def test_calibration_carries_the_measured_rate_to_another_workload() -> None:
    """Effective bandwidth = measured tokens/s x bytes per token; the new plan divides by its own bytes per token."""
    longer = Workload(prompt_tokens=64, output_tokens=200, concurrency=2, context_length=2048)
    measured = result("llama_server", planned().options, goodput=1.0, decode=90.0, prefill=0.04)
    base = planned(workload=longer)
    assert base.capacity is not None
    tuned = apply_tuning(base, Tuning(usable=((measured,),)))
    cap, cal = tuned.capacity, tuned.calibration
    assert cap is not None and cal is not None
    expected = 90.0 * (measured.bytes_per_token or 0) / cap.bytes_per_token
    assert cap.decode_tokens_per_s == pytest.approx(expected)
    assert cap.decode_tokens_per_s < 90.0  # more KV read per token at the longer sequence
    assert cal.bound_decode_tokens_per_s == base.capacity.decode_tokens_per_s
    assert cal.records == 1
    # prefill: the same effective FLOP rate over twice the prompt
    assert cap.prefill_seconds == pytest.approx(0.04 * 64 / 32)
    assert tuned.measured is None  # no record for this workload: calibrated, not re-chosen


def test_calibration_uses_the_variant_that_runs_as_the_plan_does() -> None:
    base = planned()
    one = result("llama_server", {**base.options, "threads": 1}, goodput=1.0, decode=50.0)
    two = result("llama_server", {**base.options, "threads": 2}, goodput=2.0, decode=80.0)
    plan_threads = base.options["threads"]
    tuned = apply_tuning(base, Tuning(usable=((one, two),)))
    assert tuned.calibration is not None
    want = {1: 50.0, 2: 80.0}[plan_threads]
    assert tuned.calibration.decode_tokens_per_s == pytest.approx(want * (one.bytes_per_token or 0)
                                                                  / (base.capacity.bytes_per_token if base.capacity else 1))


def test_calibration_is_per_engine() -> None:
    base = planned("llamacpp")
    other = result("llama_server", planned().options, goodput=1.0)
    tuned = apply_tuning(base, Tuning(usable=((other,),)))
    assert tuned.calibration is None and tuned.capacity == base.capacity


def test_the_median_of_recent_records_resists_one_noisy_run() -> None:
    base = planned()
    runs = tuple((result("llama_server", base.options, goodput=1.0, decode=d),) for d in (100.0, 10.0, 104.0))
    tuned = apply_tuning(base, Tuning(usable=runs))
    assert tuned.calibration is not None and tuned.calibration.records == 3
    assert tuned.calibration.decode_tokens_per_s == pytest.approx(100.0, rel=0.01)



def test_several_streams_take_the_measured_share_of_the_batched_bound() -> None:
    base = planned()
    assert base.capacity is not None and base.capacity.aggregate_tokens_per_s
    measured = result("llama_server", base.options, goodput=1.0, decode=90.0)  # 135 tokens/s over 2 streams
    share = (measured.output_tokens_per_s or 0) / (measured.predicted_aggregate_tokens_per_s or 1)
    tuned = apply_tuning(base, Tuning(usable=((measured,),)))
    assert tuned.capacity is not None and tuned.calibration is not None
    assert tuned.capacity.aggregate_tokens_per_s == pytest.approx(base.capacity.aggregate_tokens_per_s * share)
    assert tuned.calibration.aggregate_share == pytest.approx(share)
    assert tuned.calibration.bound_aggregate_tokens_per_s == base.capacity.aggregate_tokens_per_s
