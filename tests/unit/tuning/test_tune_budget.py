"""A variant slower than its estimate is stopped when the budget runs out, and recorded as such."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.modelsource import embedded_model_path
from gateway.tuning import tune as tune_module
from gateway.tuning.tune import TuneRequest, tune
from gateway.tuning.variants import Candidates, Variant
from tests.unit.tuning.helpers import SNAPSHOT, WORKLOAD, planned


def test_a_variant_that_outlasts_the_budget_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    stopped = []

    async def hangs(*args: Any, **kwargs: Any) -> None:
        try:
            await asyncio.sleep(120)  # without the cap, tune would get None back and fail
        finally:
            stopped.append(True)  # measure's own cleanup (stopping the variant's gateway) runs on cancellation

    slow = Variant("llamacpp", {"threads": 1}, "threads=1 (planned)", estimate_s=0.5)
    monkeypatch.setattr(tune_module, "measure", hangs)
    monkeypatch.setattr(tune_module, "candidates", lambda *a, **k: Candidates(planned(), [slow]))
    monkeypatch.setattr(tune_module, "OVERRUN_S", 0.5)
    record = asyncio.run(tune(SNAPSHOT, TuneRequest(embedded_model_path(), WORKLOAD, budget_s=1.0), lambda s: None))
    (only,) = record.results
    assert only.status == "failed" and "slower than the budget allows" in (only.reason or "")
    assert stopped == [True] and record.winner is None
