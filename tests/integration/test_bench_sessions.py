"""`enginegate bench --sessions`: multi-turn conversations against real emulator processes.

The emulator counts a chat prompt's words as its prompt tokens and answers `tok0 tok1 ...`, so the
prompt size of every turn is known exactly: system prompt + every user message so far + every
earlier reply. It records what it received (`--record-requests`), so the session key is checked
on the wire.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.bench.client import Target, make_session
from gateway.bench.load import Level
from gateway.bench.sessions import SessionRun, SessionSource, SessionSpec, run_sessions
from gateway.bench.stats import SLO, per_turn, summarize
from gateway.bench.workload import Length
from tests.emulators.fixture import running_emulator

pytestmark = pytest.mark.integration
REPO_ROOT = Path(__file__).resolve().parents[2]
PREFIX_WORDS = 40
USER_WORDS = 7
REPLY = 5
SYSTEM_LEAD = 5  # "You are assistant number {i}." before the synthetic words


def spec(sessions: int = 3, turns: int = 4, **kw: object) -> SessionSpec:
    return SessionSpec(sessions, turns, PREFIX_WORDS, Length("fixed", USER_WORDS), Length("fixed", REPLY), **kw)  # type: ignore[arg-type]


async def drive(url: str, s: SessionSpec, concurrency: int, seed: int = 7) -> SessionRun:
    target = Target("emu", url, "emulated-model")
    async with make_session(concurrency) as session:
        return await run_sessions(session, target, SessionSource(s), Level("concurrency", concurrency), seed)


def records(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_each_turn_carries_the_whole_conversation_and_the_session_key(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    with running_emulator("vllm", "--itl-ms", "1", "--record-requests", str(log)) as emu:
        run = await drive(emu.url, spec(), concurrency=2)
    assert len(run.results) == 12 and all(r.ok for r in run.results)
    assert run.ended_early == 0 and run.unsent == 0
    # turn t: system prompt + t user messages + (t - 1) replies of REPLY words each
    for r in run.results:
        assert r.turn is not None
        assert r.prompt_tokens == SYSTEM_LEAD + PREFIX_WORDS + r.turn * USER_WORDS + (r.turn - 1) * REPLY
        assert r.text == "tok0 tok1 tok2 tok3 tok4"
    sent = records(log)
    assert len(sent) == 12
    by_session: dict[str, list[dict]] = {}
    for rec in sent:
        headers, body = rec["headers"], rec["body"]
        assert isinstance(headers, dict) and isinstance(body, dict)
        assert headers["x-session-id"] == body["user"]
        by_session.setdefault(body["user"], []).append(body)
    assert len(by_session) == 3
    for bodies in by_session.values():
        first = bodies[0]["messages"]
        assert [m["role"] for m in first] == ["system", "user"]
        for turn, body in enumerate(bodies, 1):
            messages = body["messages"]
            assert [m["role"] for m in messages] == ["system"] + ["user", "assistant"] * (turn - 1) + ["user"]
            assert messages[: len(first)] == first  # the prefix never changes within a session
            assert all(m["content"] == "tok0 tok1 tok2 tok3 tok4" for m in messages if m["role"] == "assistant")
            assert body["max_tokens"] == REPLY and body["stream"] is True
    systems = {bodies[0]["messages"][0]["content"] for bodies in by_session.values()}
    assert len(systems) == 3  # every session has its own system prompt


async def test_turns_of_a_session_run_in_order_and_sessions_side_by_side() -> None:
    with running_emulator("vllm", "--ttft-ms", "100", "--tokens", "2") as emu:
        run = await drive(emu.url, spec(sessions=4, turns=3), concurrency=4)
    # four sessions of three 100 ms turns, all in flight: about 3 x 100 ms, far below 12 x 100 ms in a row
    assert run.duration_s >= 0.3 and run.duration_s < 12 * 0.1
    stats = summarize("c=4", run.results, run.duration_s, SLO())
    turns = per_turn(run.results)
    assert [t.turn for t in turns] == [1, 2, 3] and all(t.ok == t.sent == 4 for t in turns)
    assert [t.prompt_tokens_mean for t in turns] == [SYSTEM_LEAD + PREFIX_WORDS + t * USER_WORDS + (t - 1) * REPLY
                                                    for t in (1, 2, 3)]
    assert all(t.ttft.p50 is not None and t.ttft.p50 >= 0.1 for t in turns)
    assert stats.ok == 12


async def test_one_session_at_a_time_runs_strictly_one_after_another() -> None:
    with running_emulator("vllm", "--ttft-ms", "30", "--tokens", "1") as emu:
        run = await drive(emu.url, spec(sessions=3, turns=2), concurrency=1)
    ordered = sorted(run.results, key=lambda r: r.start)
    for a, b in zip(ordered, ordered[1:]):
        assert b.start >= a.end  # closed loop of one: nothing overlaps
    assert [r.turn for r in ordered] == [1, 2, 1, 2, 1, 2]


async def test_a_failed_turn_ends_its_session_and_is_counted() -> None:
    with running_emulator("vllm", "--fail-status", "503") as emu:
        run = await drive(emu.url, spec(sessions=3, turns=4), concurrency=3)
    assert [r.error for r in run.results] == ["http_503"] * 3 and {r.turn for r in run.results} == {1}
    assert run.ended_early == 3 and run.unsent == 9


async def test_the_session_key_can_be_left_out(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    with running_emulator("vllm", "--record-requests", str(log)) as emu:
        await drive(emu.url, spec(sessions=1, turns=2, session_header=None, session_user=False), concurrency=1)
    for rec in records(log):
        assert "x-session-id" not in rec["headers"] and "user" not in rec["body"]  # type: ignore[operator]


def test_same_seed_same_conversations_other_seed_other_prompts() -> None:
    src = SessionSource(spec())
    a, b, c = src.open(3, 0), src.open(3, 0), src.open(4, 0)
    assert a.messages == b.messages and a.messages != c.messages
    assert src.turn(a, 1).body == src.turn(b, 1).body
    assert src.open(3, 0).session_id != src.open(3, 1).session_id != src.open(4, 0).session_id


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([sys.executable, "-m", "gateway.commands.bench", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_cli_sessions_report_per_turn_ttft_and_json() -> None:
    with running_emulator("vllm", "--ttft-ms", "20", "--itl-ms", "1") as emu:
        done = cli("--base-url", emu.base_url, "--sessions", "3", "--turns", "3", "--session-prefix-tokens", "30",
                   "--input-tokens", "6", "--output-tokens", "4", "--json", "--no-progress", "--no-ceiling",
                   "--warmup", "1")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["sessions"]["sessions"] == 3 and report["sessions"]["turns"] == 3
    (level,) = report["results"]["A"]
    assert level["label"] == "c=3" and level["ok"] == 9 and level["sent"] == 9
    assert [t["turn"] for t in level["turns"]] == [1, 2, 3]
    assert [t["prompt_tokens_mean"] for t in level["turns"]] == [SYSTEM_LEAD + 30 + t * 6 + (t - 1) * 4 for t in (1, 2, 3)]
    assert all(t["ttft"]["p50"] >= 0.02 for t in level["turns"])
    assert "### Per turn (TTFT in ms)" in done.stderr and "3 sessions x 3 turns" in done.stderr


def test_cli_rejects_sessions_with_rates_or_request_budgets() -> None:
    for extra in (["--rate", "2"], ["--requests", "5"], ["--endpoint", "completions"]):
        bad = cli("--base-url", "http://127.0.0.1:9", "--model", "m", "--sessions", "2", *extra)
        assert bad.returncode == 2 and "--sessions" in bad.stderr, (extra, bad.stderr)


def test_cached_prompt_tokens_come_from_usage() -> None:
    from gateway.bench.client import RequestResult, _apply_usage
    from gateway.bench.stats import cached_fraction

    told, silent, odd = RequestResult(0.0), RequestResult(0.0), RequestResult(0.0)
    _apply_usage(told, {"prompt_tokens": 400, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 300}})
    _apply_usage(silent, {"prompt_tokens": 100, "completion_tokens": 2})
    _apply_usage(odd, {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": True}})
    assert (told.cached_tokens, silent.cached_tokens, odd.cached_tokens) == (300, None, None)
    assert cached_fraction([told, silent, odd]) == 0.75  # over the answers that said
    assert cached_fraction([silent]) is None


async def test_open_loop_sessions_start_on_schedule_and_think_between_turns() -> None:
    from gateway.bench.sessions import schedule

    s = SessionSpec(4, 3, 0, Length("fixed", USER_WORDS), Length("fixed", 2), think_seconds=0.05)
    plan = schedule(s, 5.0, seed=21)
    assert plan.starts is not None
    with running_emulator("vllm", "--ttft-ms", "10", "--itl-ms", "1") as emu:
        target = Target("emu", emu.url, "emulated-model")
        async with make_session(0) as session:
            run = await run_sessions(session, target, SessionSource(s), Level("arrivals", 5.0), seed=3, timing_seed=21)
    assert len(run.results) == 12 and all(r.ok for r in run.results) and len(run.traces) == 4
    t0 = min(r.start for r in run.results)
    for index, trace in enumerate(run.traces):
        first, *later = trace.results
        # each session opens at its own arrival time, whatever the others are doing (open loop)
        assert first.start - t0 >= plan.starts[index] - plan.starts[0] - 0.005  # (clocks: perf_counter vs loop)
        for turn, (prev, cur) in enumerate(zip(trace.results, later)):
            assert cur.start - prev.end >= plan.thinks[index][turn]


def test_cli_open_loop_shared_prompt_and_documents_report_the_minimum(tmp_path: Path) -> None:
    # the emulator counts words: every prompt's size is known, so the minimum is exact here
    log = tmp_path / "requests.jsonl"
    with running_emulator("vllm", "--itl-ms", "1", "--record-requests", str(log)) as emu:
        done = cli("--base-url", emu.base_url, "--sessions", "3", "--turns", "3", "--arrival-rate", "20",
                   "--think-seconds", "0.01", "--shared-prefix-tokens", "30", "--document-tokens", "20",
                   "--input-tokens", "6", "--output-tokens", "4", "--seed", "5", "--json", "--no-progress",
                   "--no-ceiling", "--warmup", "0")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["sessions"]["shared_prefix_tokens"] == 30 and report["sessions"]["session_prefix_tokens"] == 0
    (level,) = report["results"]["A"]
    assert level["label"] == "arrivals=20/s" and level["ok"] == 9
    work = level["prompt_work"]
    # turn 1: 30 shared + 20 document + 6 question; each later turn adds the 4-word reply and 6 words
    assert work["prompt_tokens"] == 3 * (56 + 66 + 76)
    assert work["shared_tokens"] == 30
    assert work["minimum"] == 30 + 3 * 26 + 3 * 2 * 6
    assert work["computed"] is None and work["ratio"] is None  # this emulator reports no cached tokens
    assert "### Prompt tokens computed against a perfect cache" in done.stderr
    bodies = [rec["body"] for rec in records(log)]
    systems = {b["messages"][0]["content"] for b in bodies}
    assert len(systems) == 1 and len(next(iter(systems)).split()) == 30  # one system prompt, shared by all
    documents = {b["messages"][1]["content"].split("\n\n")[0] for b in bodies}
    assert len(documents) == 3 and all(len(d.split()) == 20 for d in documents)  # one document per session


def test_cli_rejects_arrival_rates_with_concurrency_or_without_sessions() -> None:
    for args in (["--sessions", "2", "--arrival-rate", "1", "--concurrency", "2"], ["--arrival-rate", "1"],
                 ["--sessions", "2", "--arrival-rate", "1", "--max-concurrency", "1"],
                 ["--sessions", "2", "--arrival-rate", "0"], ["--sessions", "2", "--think-seconds", "-1"]):
        bad = cli("--base-url", "http://127.0.0.1:9", "--model", "m", *args)
        assert bad.returncode == 2 and "enginegate bench:" in bad.stderr and "Traceback" not in bad.stderr, (args, bad.stderr)


def test_scripts_get_the_same_figures_from_bench_sessions() -> None:
    from gateway.bench.runner import bench_sessions

    s = SessionSpec(2, 2, 0, Length("fixed", 6), Length("fixed", 4), shared_prefix_tokens=30, document_tokens=20)
    with running_emulator("vllm", "--itl-ms", "1") as emu:
        stats = bench_sessions(emu.base_url, "emulated-model", s, arrivals_per_s=10.0, seed=5)
    assert stats.label == "arrivals=10/s" and stats.ok == 4
    assert stats.prompt_work is not None and stats.prompt_work.minimum == 30 + 2 * 26 + 2 * 6
    assert stats.ttft.p50 is not None and stats.ttft.p90 is not None and stats.output_tps > 0
    with pytest.raises(ValueError, match="not both"):
        bench_sessions("http://127.0.0.1:9", "m", s, arrivals_per_s=1.0, concurrency=2)
