"""Which variants tune measures, in which order, within which budget."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from gateway.planning import Workload
from gateway.tuning.variants import TuneError, _with, candidates, estimate_s, label
from tests.unit.tuning.helpers import SNAPSHOT, WORKLOAD, spec

LEVELS = [1, 2]


def both(engine: str, options: Mapping[str, Any]) -> str | None:
    return None if engine in ("llamacpp", "llama_server") else f"{engine} not installed"


def no_server(engine: str, options: Mapping[str, Any]) -> str | None:
    return "llama-server not found in PATH or the cache; build it" if engine == "llama_server" else both(engine, options)


def test_every_candidate_gets_its_planned_variant_first() -> None:
    c = candidates(SNAPSHOT, spec(), WORKLOAD, engines=None, budget_s=1000, requests=4, levels=LEVELS, missing=both)
    assert c.base.engine == "llama_server"
    first_two = c.variants[:2]
    assert [v.engine for v in first_two] == ["llama_server", "llamacpp"]
    assert all(v.label.endswith("(planned)") for v in first_two)
    assert first_two[0].options == c.base.options
    labels = [v.label for v in c.variants if v.engine == "llama_server"]
    assert len(labels) == 3 and len(set(labels)) == 3
    cores = SNAPSHOT.cpu.logical_cores
    assert any(v.options["threads"] == cores for v in c.variants if v.engine == "llamacpp")


def test_slot_variants_keep_each_slots_share_of_the_unified_cache() -> None:
    options = {"parallel": 2, "context_length": 512, "extra_args": ["--kv-unified"]}
    assert _with(options, "parallel", 4)["context_length"] == 1024
    assert _with(options, "parallel", 1)["context_length"] == 512
    assert _with({"parallel": 2, "context_length": 512}, "parallel", 4)["context_length"] == 512


def test_the_budget_cuts_the_list_and_says_what_was_left_out() -> None:
    full = candidates(SNAPSHOT, spec(), WORKLOAD, engines=None, budget_s=1000, requests=4, levels=LEVELS, missing=both)
    one = full.variants[0].estimate_s
    cut = candidates(SNAPSHOT, spec(), WORKLOAD, engines=None, budget_s=one * 2.5, requests=4, levels=LEVELS,
                     missing=both)
    assert len(cut.variants) == 2 and len(cut.skipped) == len(full.variants) - 2
    assert {v.engine for v in cut.variants} == {"llama_server", "llamacpp"}


def test_a_budget_too_small_for_one_candidate_is_refused_with_the_figure() -> None:
    with pytest.raises(TuneError, match=r"--budget-seconds 1 is too small for one candidate: llama_server .* give at least \d+"):
        candidates(SNAPSHOT, spec(), WORKLOAD, engines=None, budget_s=1, requests=4, levels=LEVELS, missing=both)


def test_an_unknown_engine_is_refused_with_the_known_ones() -> None:
    with pytest.raises(TuneError, match="unknown engine.*nope.*known: .*llamacpp"):
        candidates(SNAPSHOT, spec(), WORKLOAD, engines=["nope"], budget_s=100, requests=4, levels=LEVELS, missing=both)


def test_a_missing_binary_is_recorded_not_started() -> None:
    c = candidates(SNAPSHOT, spec(), WORKLOAD, engines=["llama_server", "llamacpp"], budget_s=1000, requests=4,
                   levels=LEVELS, missing=no_server)
    server = [v for v in c.variants if v.engine == "llama_server"]
    assert len(server) == 1 and server[0].problem_status == "not_installed"
    assert "llama-server not found" in (server[0].problem or "")
    assert any(v.engine == "llamacpp" and v.problem is None for v in c.variants)


def test_an_engine_that_cannot_load_the_model_is_recorded_with_why() -> None:
    c = candidates(SNAPSHOT, spec(), WORKLOAD, engines=["vllm", "llamacpp"], budget_s=1000, requests=4,
                   levels=LEVELS, missing=lambda e, o: None)
    vllm = [v for v in c.variants if v.engine == "vllm"]
    assert len(vllm) == 1 and vllm[0].problem and "not gguf" in vllm[0].problem


def test_estimates_grow_with_the_work() -> None:
    w = Workload(prompt_tokens=32, output_tokens=16)
    small = estimate_s("llamacpp", 100.0, None, w, 4, [1])
    assert estimate_s("llamacpp", 100.0, None, w, 8, [1]) > small
    assert estimate_s("llamacpp", 50.0, None, w, 4, [1]) > small
    assert estimate_s("vllm", 100.0, None, w, 4, [1]) > small  # a GPU engine's start-up


def test_an_edit_workload_measures_speculation_off_and_its_other_mode_first() -> None:
    edit = Workload(prompt_tokens=32, output_tokens=32, output_copies_prompt=True, shared_prefix=True, context_length=512)
    c = candidates(SNAPSHOT, spec(), edit, engines=["llama_server"], budget_s=1000, requests=2, levels=[1],
                   missing=both, max_variants=4)
    server = [v.options for v in c.variants]
    assert [o["spec_type"] for o in server] == ["ngram-simple", "none", "ngram-mod", "ngram-simple"]
    assert server[0]["cache_ram_mib"] > 0 and server[3]["cache_ram_mib"] == 0  # then the prompt cache off
    assert c.variants[1].label.startswith("threads=1") and "spec_type=none" in c.variants[1].label


def test_free_generation_measures_threads_and_slots_before_speculation() -> None:
    c = candidates(SNAPSHOT, spec(), WORKLOAD, engines=["llama_server"], budget_s=1000, requests=2, levels=[1],
                   missing=both, max_variants=10)
    changed = [next(k for k in v.options if v.options[k] != c.variants[0].options.get(k)) for v in c.variants[1:]]
    assert changed[:2] == ["threads", "parallel"] and "spec_type" in changed
    assert next(v for v in c.variants if v.options["spec_type"] == "ngram-simple").label.count("spec_type=ngram-simple") == 1


def test_labels_name_the_speculation_method_and_off() -> None:
    assert label({"speculative_config": {"method": "ngram", "num_speculative_tokens": 4}}) == "speculative_config=ngram"
    assert label({"speculative_config": None, "prefix_caching": False}) == "speculative_config=off prefix_caching=False"
