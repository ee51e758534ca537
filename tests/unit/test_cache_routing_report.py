"""The pure parts of benchmarks/cache_routing.py: run order, median and spread, ratios, the table."""

from __future__ import annotations

import pytest

from benchmarks.cache_routing_report import Spread, across_table, cell, ratio, rotated, summarize, table

VARIANTS = ["round_robin", "least_outstanding", "prefix", "session", "cache", "sglang_router"]


def test_rotation_puts_every_variant_in_every_position_once():
    orders = [rotated(VARIANTS, r) for r in range(len(VARIANTS))]
    assert orders[0] == VARIANTS
    assert orders[1] == VARIANTS[1:] + VARIANTS[:1]
    for order in orders:
        assert sorted(order) == sorted(VARIANTS)
    for position in range(len(VARIANTS)):
        assert sorted(order[position] for order in orders) == sorted(VARIANTS)
    assert rotated(VARIANTS, len(VARIANTS)) == VARIANTS  # wraps around
    assert rotated([], 3) == []


@pytest.mark.parametrize(("values", "expected"), [
    ([3.0, 1.0, 2.0], Spread(2.0, 1.0, 3.0, 3)),
    ([4.0, None, 2.0], Spread(3.0, 2.0, 4.0, 2)),  # a run that measured nothing does not count
    ([5.0], Spread(5.0, 5.0, 5.0, 1)),
])
def test_spread_is_median_and_range_of_the_known_values(values, expected):
    assert Spread.of(values) == expected


def test_spread_of_nothing_is_none():
    assert Spread.of([None, None]) is None
    assert Spread.of([]) is None


def test_cell_shows_median_then_range():
    assert cell(Spread(1.234, 1.0, 2.5, 3), scale=1000) == "1234 (1000-2500)"
    assert cell(Spread(7.25, 7.25, 7.25, 1), digits=1) == "7.2"  # one run: no range
    assert cell(None) == "-"


def test_ratio_is_median_over_median():
    assert ratio(Spread(3.0, 1.0, 5.0, 3), Spread(1.5, 1.0, 9.0, 3)) == pytest.approx(2.0)
    assert ratio(None, Spread(1.0, 1.0, 1.0, 1)) is None
    assert ratio(Spread(1.0, 1.0, 1.0, 1), Spread(0.0, 0.0, 0.0, 1)) is None


def _run(variant: str, p50: float, computed: float, minimum: float | None = 1000.0) -> dict[str, object]:
    return {"variant": variant, "ttft_p50": p50, "ttft_p90": 2 * p50, "output_tps": 10.0,
            "computed": computed, "minimum": minimum}


def test_summary_groups_runs_by_variant():
    runs = [_run("cache", 1.0, 1100), _run("least_outstanding", 3.0, 2400), _run("cache", 2.0, 1300),
            _run("cache", 1.5, 1200)]
    summary = summarize(runs)
    assert summary["cache"]["ttft_p50"] == Spread(1.5, 1.0, 2.0, 3)
    assert summary["cache"]["computed"] == Spread(1200.0, 1100.0, 1300.0, 3)
    assert summary["least_outstanding"]["ttft_p90"] == Spread(6.0, 6.0, 6.0, 1)


def test_table_has_gains_against_least_outstanding_and_sglang():
    runs = [_run("least_outstanding", 3.0, 2400), _run("sglang_router", 2.0, 1500), _run("cache", 1.0, 1200),
            _run("prefix", 2.0, 2000, minimum=None)]
    lines = table(summarize(runs), ["least_outstanding", "cache", "sglang_router", "prefix", "absent"]).splitlines()
    assert len(lines) == 2 + 4  # header, rule, one row per variant that ran (absent has none)
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in lines[2:]}
    cache = rows["cache"]
    assert cache[2] == "1000"  # TTFT p50 ms
    assert cache[7] == "1.20x"  # computed / minimum
    assert cache[8] == "3.00x"  # least_outstanding's p50 over cache's
    assert cache[9].rstrip(" |") == "2.00x"  # sglang-router's p50 over cache's
    assert rows["least_outstanding"][8] == "1.00x"
    assert rows["prefix"][6] == "-" and rows["prefix"][7] == "-"  # no minimum from the bench: no ratio


def test_table_without_the_peers_leaves_their_columns_empty():
    lines = table(summarize([_run("cache", 1.0, 1200)]), ["cache"]).splitlines()
    cols = lines[2].split(" | ")
    assert cols[8] == "-" and cols[9].rstrip(" |") == "-"


def test_workload_flags_follow_the_bench_it_drives():
    from benchmarks.cache_routing import Workload  # noqa: PLC0415 - imports the gateway's test helpers

    open_loop = Workload("open", 10, 4, 300, 200, 32, 16, arrival_rate=0.2, think_seconds=3.0)
    argv = open_loop.bench_args("--arrival-rate --session-prefix-tokens")
    flags = dict(zip(argv[::2], argv[1::2]))
    assert flags["--shared-prefix-tokens"] == "300" and flags["--document-tokens"] == "200"
    assert flags["--arrival-rate"] == "0.2" and flags["--think-seconds"] == "3.0"
    closed = Workload("closed", 8, 4, 500, 0, 32, 16)
    assert "--session-prefix-tokens" in closed.bench_args("... --session-prefix-tokens K ...")  # since issue 25
    before = closed.bench_args("... --shared-prefix-tokens N ...")  # before it, the flag of a session's own prompt
    assert "--shared-prefix-tokens" in before and "--arrival-rate" not in before


def test_engine_argv_compares_without_its_port():
    from benchmarks.cache_routing import normalized  # noqa: PLC0415

    a = ["llama-server", "-m", "x.gguf", "--port", "4001", "-np", "2"]
    b = ["llama-server", "-m", "x.gguf", "--port", "4002", "-np", "2"]
    assert normalized(a) == normalized(b) == ["llama-server", "-m", "x.gguf", "--port", "PORT", "-np", "2"]
    assert normalized(a) != normalized([*b[:-1], "4"])


def test_routing_decisions_are_read_per_replica_and_reason():
    from benchmarks.cache_routing import _decisions, _per_replica  # noqa: PLC0415

    metrics = "\n".join([
        '# TYPE enginegate_routing_decisions_total counter',
        'enginegate_routing_decisions_total{model="smollm",reason="cache_hit",replica="0"} 6.0',
        'enginegate_routing_decisions_total{model="smollm",reason="cache_load",replica="0"} 1.0',
        'enginegate_routing_decisions_total{model="smollm",reason="cache_cold",replica="1"} 2.0',
        'enginegate_routing_decisions_total{model="smollm",reason="affinity",replica="1"} 0.0',  # never chosen
        'enginegate_routing_decisions_total{model="other",reason="cache_hit",replica="0"} 9.0',  # another model
    ])
    decisions = _decisions(metrics)
    assert decisions == {"r0 cache_hit": 6, "r0 cache_load": 1, "r1 cache_cold": 2}
    assert _per_replica(decisions) == {"r0 requests": 7.0, "r1 requests": 2.0}


def test_routing_options_reach_every_gateway_variant():
    import json  # noqa: PLC0415

    from benchmarks.cache_routing import Engines, config_yaml, parse_args  # noqa: PLC0415

    args = parse_args(["--routing-option", "health_interval_seconds=600", "--routing-option", "load_factor=1.5"])
    assert args.routing == {"health_interval_seconds": 600, "load_factor": 1.5}
    engines = Engines(2, 8192, 1, 0, ("--kv-unified",))
    model = json.loads(config_yaml("least_outstanding", engines, args.routing))["models"][0]
    assert model["routing"] == {"balance": "least_outstanding", "affinity": "none", "health_interval_seconds": 600,
                                "load_factor": 1.5}
    assert model["options"]["parallel"] == 2 and model["options"]["cache_ram_mib"] == 0
    assert model["replicas"] == 2


def test_a_failed_run_counts_in_no_median():
    runs = [_run("cache", 1.0, 1100), {"variant": "cache", "error": "RuntimeError: gateway not ready"},
            _run("cache", 3.0, 1300)]
    summary = summarize(runs)
    assert summary["cache"]["ttft_p50"] == Spread(2.0, 1.0, 3.0, 2)
    assert table(summary, ["cache"]).splitlines()[2].split(" | ")[1] == "2"  # runs that measured


def test_one_gain_column_per_peer():
    runs = [_run("least_outstanding", 3.0, 2400), _run("sglang_router", 2.0, 1500),
            _run("sglang_router_t0.7", 0.5, 1500), _run("cache", 1.0, 1200)]
    peers = ["least_outstanding", "sglang_router", "sglang_router_t0.7"]
    lines = table(summarize(runs), ["cache"], peers).splitlines()
    assert lines[0].count("TTFT p50 gain vs") == 3 and lines[1].count("---") == 8 + 3
    cols = lines[2].split(" | ")
    assert cols[8:10] == ["3.00x", "2.00x"] and cols[10].rstrip(" |") == "0.50x"


def test_render_reads_a_saved_benchmark():
    from benchmarks.cache_routing import Engines, Workload, render  # noqa: PLC0415

    def run(variant: str, scenario: str, p50: float, **extra: object) -> dict[str, object]:
        return {**_run(variant, p50, 2000), "scenario": scenario, "round": 1, "shared_tokens": 310,
                "per_replica": {"r0 requests": 20.0, "r1 requests": 20.0}, **extra}

    from dataclasses import asdict  # noqa: PLC0415

    doc = {"engines": asdict(Engines(2, 8192, 1, 0, ("--kv-unified",))), "engine_argv": ["llama-server", "--port", "1"],
           "engine_argv_differs": {}, "versions": {"llama-server": "b1"}, "seed": 25, "elapsed_s": 100,
           "routing_options": {}, "variants": {"open": ["least_outstanding", "cache"], "closed": ["cache"]},
           "workloads": {"open": asdict(Workload("open", 10, 4, 300, 200, 32, 16, 0.2, 3.0)),
                         "closed": asdict(Workload("closed", 4, 4, 600, 0, 32, 16))},
           "runs": [run("least_outstanding", "open", 3.0), run("cache", "open", 1.0),
                    {"variant": "cache", "scenario": "closed", "round": 1, "error": "RuntimeError: boom"}]}
    text = render(doc)
    assert "--port PORT" in text and "open loop: 10 sessions arriving at 0.2/s" in text
    assert "| cache | 1 | 1000 |" in text and "3.00x" in text
    assert "- cache: failed" in text  # the closed case's only run failed: listed, no table row
    assert "310 tokens above it" in text


def test_the_across_gateways_table_divides_by_one_gateways_computed_tokens():
    runs = [{"variant": "one_gateway", "computed": 1000.0, "minimum": 800.0, "ttft_p50": 0.5},
            {"variant": "two_gateways", "computed": 1100.0, "minimum": 800.0, "ttft_p50": 0.6},
            {"variant": "two_gateways_no_peers", "computed": 1500.0, "minimum": 800.0, "ttft_p50": 0.9},
            {"variant": "two_gateways_no_peers", "error": "RuntimeError: x"}]
    text = across_table(runs)
    assert "| two_gateways | 1 | 1100 | 800 | 1.38x | 1.10x | 600 |" in text
    assert "| two_gateways_no_peers | 1 (+1 failed) | 1500 | 800 | 1.88x | 1.50x | 900 |" in text
    assert "| one_gateway | 1 | 1000 | 800 | 1.25x | 1.00x | 500 |" in text
