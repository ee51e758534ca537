"""What each model charges the budget, the pools' budget, and the engines tried in order."""

from __future__ import annotations

import subprocess
import sys

from gateway import planning
from gateway.config import MemoryBudget
from gateway.loading import capacity, charges
from gateway.planning import ENGINES, installed_set, load_spec
from gateway.routing import footprint
from tests.unit.hosts import MODELS, embedded_gguf, host

ALL = installed_set(set(ENGINES))


def test_a_model_on_two_gpus_charges_each_its_share() -> None:
    plan = planning.plan(host("4x-a100-nvlink"), load_spec(MODELS / "llama-3-70b"), installed=ALL)
    assert plan.capacity is not None and plan.capacity.memory == "vram" and len(plan.capacity.gpus) == 2
    charged = charges(plan, None)
    assert set(charged) == {f"gpu:{i}" for i in plan.capacity.gpus}
    assert sum(charged.values()) == plan.capacity.required_bytes - plan.capacity.required_bytes % 2


def test_cpu_plans_charge_ram_and_a_smaller_user_context_shrinks_the_kv_part() -> None:
    snapshot = host("build-machine")
    plan = planning.plan(snapshot, load_spec(embedded_gguf()), requested_engine="llamacpp", installed=ALL)
    assert plan.capacity is not None
    full = charges(plan, None)["ram"]
    assert full == plan.capacity.required_bytes
    small = planning.apply_user(plan, {"context_length": 512}, snapshot)
    weights = plan.capacity.weights_bytes
    assert charges(small, None)["ram"] == weights + (full - weights) * 512 // plan.capacity.context_length


def test_unplanned_models_charge_their_file_size() -> None:
    assert charges(None, embedded_gguf()) == {"ram": embedded_gguf().stat().st_size}


def test_the_budget_is_the_detected_size_unless_the_config_sets_it() -> None:
    gpus = host("2x-rtx-4090")
    detected = capacity(gpus, MemoryBudget())
    assert detected["gpu:0"] > 20 * 10**9 and "ram" in detected
    override = capacity(gpus, MemoryBudget(ram_bytes=10**9, gpu_bytes={1: 5 * 10**9}))
    assert override["ram"] == 10**9 and override["gpu:1"] == 5 * 10**9 and override["gpu:0"] == detected["gpu:0"]
    assert capacity(host("macbook-air-m2"), MemoryBudget()).get("unified", 0) > 0


def test_an_engine_servers_process_group_is_measured_whole() -> None:
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)"],
                              start_new_session=True)
    try:
        for _ in range(200):
            if len(footprint.group_pids(parent.pid)) == 2:
                break
            subprocess.run(["sleep", "0.05"])
        assert len(footprint.group_pids(parent.pid)) == 2
        measured = footprint.measure_group(parent.pid)
        assert measured["ram"] > 2 * 5 * 2**20  # two Python interpreters
    finally:
        import os
        import signal
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
    for _ in range(200):  # the orphaned child dies (and is reaped by init) a moment after the signal
        if footprint.group_rss(parent.pid) is None:
            break
        subprocess.run(["sleep", "0.05"])
    assert footprint.group_rss(parent.pid) is None


def test_fallback_false_tries_only_the_models_own_engine() -> None:
    from adapters import registry
    from gateway.config import ModelConfig
    from gateway.loading import engine_choices

    snapshot = host("build-machine")
    path = embedded_gguf()
    plan = planning.plan(snapshot, load_spec(path), requested_engine="llama_server", installed=ALL)
    first = registry.spec("llama_server")
    built: list[str] = []

    def build(engine, _plan, _user):  # type: ignore[no-untyped-def]
        built.append(engine.name)
        return []

    with_fallback = engine_choices(plan, first, path, snapshot, ModelConfig(engine="llama_server"), build)
    alone = engine_choices(plan, first, path, snapshot, ModelConfig(engine="llama_server", fallback=False), build)
    assert [c.engine for c in alone] == ["llama_server"]
    assert len(with_fallback) > 1 and with_fallback[1].engine == "llamacpp"  # the mode's own engine next
