"""The report and the self-ceiling warnings, from fixed level statistics (no network)."""

from __future__ import annotations

import dataclasses
import io
import sys

import pytest

from gateway.bench.ceiling import Ceiling, bound_warnings
from gateway.bench.client import RequestResult, Target
from gateway.bench.load import Level
from gateway.bench.report import render, to_json
from gateway.bench.runner import BenchPlan, BenchResult
from gateway.bench.stats import SLO, LevelStats, summarize
from gateway.bench.workload import Length, PromptSource


def level(label: str, ttft: float, tokens: int = 10, cpu_s: float = 0.1, errors: int = 0) -> LevelStats:
    ok = [RequestResult(start=0.0, end=ttft + 0.9, ttft=ttft, content_times=[ttft, ttft + 0.9], prompt_tokens=5,
                        completion_tokens=tokens, max_tokens=tokens) for _ in range(4)]
    bad = [RequestResult(start=0.0, end=0.1, error="http_503", detail='{"error": "busy"}') for _ in range(errors)]
    return summarize(label, ok + bad, 2.0, SLO(ttft=0.5), cpu_s)


def result() -> BenchResult:
    targets = [Target("gateway", "http://a", "m"), Target("engine", "http://b/v1", "m")]
    plan = BenchPlan(targets, [Level("concurrency", 1), Level("concurrency", 4)],
                     PromptSource("chat", Length("fixed", 8), Length("fixed", 10)), SLO(ttft=0.5), requests=4)
    return BenchResult(plan, {"gateway": [level("c=1", 0.2), level("c=4", 0.6, errors=1)],
                              "engine": [level("c=1", 0.1), level("c=4", 0.3)]},
                       Ceiling(4, 1000.0, 16000.0, 0.95), wall_s=3.0)


def test_render_has_both_tables_the_ratios_and_the_errors() -> None:
    text = render(result())
    assert "| gateway  | c=4   | 4/5     | http_503: 1 |" in text
    assert "### Ratios: engine / gateway" in text
    ratio_row = next(line for line in text.splitlines() if line.startswith("| c=1 ") and "-100.00" in line)
    assert "| 0.500 " in ratio_row  # engine TTFT p50 is half the gateway's
    assert "http_503" in text and '{"error": "busy"}' in text
    assert "output length held: yes" in text
    assert "goodput" in text and "2.00 (100%)" in text and "0.00 (0%)" in text


def test_json_is_complete_and_in_seconds() -> None:
    doc = to_json(result())
    assert doc["units"]["latency"] == "seconds"
    assert doc["results"]["gateway"][0]["ttft"]["p50"] == 0.2
    assert doc["ceiling"]["request_rate"] == 1000.0
    assert doc["targets"][0]["api_key"] is False


def test_warnings_when_the_client_is_busy_or_near_its_ceiling() -> None:
    ceiling = Ceiling(4, 10.0, 1000.0, 0.95)
    busy = level("c=1", 0.1, cpu_s=1.8)  # 90% of a core over 2 s
    assert any("90% of a core" in w for w in bound_warnings(busy, None))
    near = level("c=1", 0.1)  # 2 req/s against a 10 req/s ceiling: fine; 4 events/s
    assert bound_warnings(near, ceiling) == []
    fast = dataclasses.replace(near, request_rate=6.0)
    assert any("60% of the bench's own ceiling" in w for w in bound_warnings(fast, ceiling))


def test_package_exports_resolve() -> None:
    import gateway.bench as bench

    assert all(getattr(bench, name, None) is not None for name in bench.__all__)
    assert sorted(bench.__all__) == sorted(set(bench.__all__))


def test_progress_bar_draws_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tqdm")
    from gateway.commands.bench import _progress_factory

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    make = _progress_factory(True)
    assert make is not None and _progress_factory(False) is None
    bar = make("gateway c=4", 3)
    for _ in range(3):
        bar.update(1)
    bar.set_postfix_str("errors=1")
    bar.close()
    assert "gateway c=4" in screen.getvalue() and "3/3" in screen.getvalue()
