"""Tune records built from real plans on a recorded host (no engine runs in these tests)."""

from __future__ import annotations

from typing import Any

from gateway.modelsource import embedded_model_path
from gateway.planning import Plan, Workload, installed_set, load_spec, plan
from gateway.planning.measured import VariantResult
from gateway.tuning.fingerprint import host_fingerprint, model_identity
from gateway.tuning.record import TuneRecord
from gateway.tuning.tune import rank
from tests.unit.hosts import host

_RECORDED = host("build-machine")
SNAPSHOT = _RECORDED.model_copy(update={"cpu": _RECORDED.cpu.model_copy(update={"measured_bandwidth_gbps": 14.0})})
"""The build machine after `enginegate doctor` measured 14 GB/s: the planner has a decode bound."""
WORKLOAD = Workload(prompt_tokens=32, output_tokens=16, concurrency=2, context_length=512)
BOTH = installed_set({"llamacpp", "llama_server"})


def spec():  # type: ignore[no-untyped-def]
    return load_spec(embedded_model_path())


def planned(engine: str = "auto", workload: Workload = WORKLOAD) -> Plan:
    return plan(SNAPSHOT, spec(), workload, requested_engine=engine, installed=BOTH)


def result(engine: str, options: dict[str, Any], *, goodput: float, decode: float = 100.0, label: str = "v",
           prefill: float = 0.05, status: str = "ok", workload: Workload = WORKLOAD) -> VariantResult:
    p = planned(engine, workload)
    assert p.capacity is not None
    return VariantResult(
        engine=engine, label=label, options=options, status=status,  # type: ignore[arg-type]
        reason=None if status == "ok" else "it broke",
        decode_tokens_per_s=decode if status == "ok" else None, prefill_s=prefill if status == "ok" else None,
        concurrency=workload.concurrency, output_tokens_per_s=decode * 1.5 if status == "ok" else None,
        goodput_rps=goodput if status == "ok" else None, request_rate=goodput if status == "ok" else None,
        predicted_decode_tokens_per_s=p.capacity.decode_tokens_per_s, bytes_per_token=p.capacity.bytes_per_token,
        predicted_aggregate_tokens_per_s=p.capacity.aggregate_tokens_per_s,
        prompt_tokens=workload.prompt_tokens, params_active=spec().params_active, peak_memory_bytes=250 << 20)


def record(results: list[VariantResult], workload: Workload = WORKLOAD, snapshot=SNAPSHOT,  # type: ignore[no-untyped-def]
           versions: dict[str, str | None] | None = None) -> TuneRecord:
    return TuneRecord(host=host_fingerprint(snapshot), model=model_identity(embedded_model_path()), workload=workload,
                      engine_versions=versions if versions is not None else {r.engine: "v1" for r in results},
                      results=rank(results), budget_s=100, wall_s=80)
