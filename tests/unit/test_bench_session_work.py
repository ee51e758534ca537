"""Multi-turn sessions, pure parts: the arrival and think-time schedule, and the prompt tokens a
perfect prefix cache would compute (derived from usage) against what the endpoint computed."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import pytest

from gateway.bench.client import RequestResult
from gateway.bench.sessions import SessionSource, SessionSpec, schedule
from gateway.bench.stats import SessionTrace, minimum_prompt_tokens, prompt_work
from gateway.bench.workload import Length


def spec(sessions: int = 4, turns: int = 3, think: float = 0.0, **kw: int) -> SessionSpec:
    return SessionSpec(sessions, turns, kw.get("own", 0), Length("fixed", 8), Length("fixed", 4),
                       shared_prefix_tokens=kw.get("shared", 0), document_tokens=kw.get("document", 0),
                       think_seconds=think)


def answer(prompt: int | None, completion: int | None = 4, cached: int | None = None,
           error: str | None = None) -> RequestResult:
    return RequestResult(0.0, error=error, prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached)


# --- schedule ---------------------------------------------------------------------------------


def test_the_same_seed_gives_the_same_arrival_and_think_times() -> None:
    s = spec(sessions=50, turns=4, think=2.0)
    a, b, other = schedule(s, 3.0, seed=11), schedule(s, 3.0, seed=11), schedule(s, 3.0, seed=12)
    assert a == b and a.starts != other.starts and a.thinks != other.thinks
    assert a.starts is not None and len(a.starts) == 50 and a.starts[0] == 0.0
    assert a.starts == sorted(a.starts)
    assert [len(t) for t in a.thinks] == [3] * 50 and all(x > 0 for t in a.thinks for x in t)


def test_arrivals_follow_the_rate() -> None:
    # a Poisson process at R: exponential gaps of mean 1/R (10,000 gaps: the mean is within 3 % of 1/R
    # with overwhelming probability) whose spread equals their mean
    for rate in (0.5, 4.0, 40.0):
        starts = schedule(spec(sessions=10_001, turns=1), rate, seed=5).starts
        assert starts is not None
        gaps = [b - a for a, b in zip(starts, starts[1:])]
        assert statistics.fmean(gaps) == pytest.approx(1 / rate, rel=0.03)
        assert statistics.stdev(gaps) == pytest.approx(1 / rate, rel=0.05)


def test_closed_loop_has_no_starts_and_no_think_time_unless_asked() -> None:
    plan = schedule(spec(sessions=3, turns=3), None, seed=1)
    assert plan.starts is None and plan.thinks == [[0.0, 0.0]] * 3


def test_think_times_are_exponential_with_the_given_mean() -> None:
    thinks = [x for t in schedule(spec(sessions=2_500, turns=5, think=1.5), None, seed=3).thinks for x in t]
    assert len(thinks) == 10_000
    assert statistics.fmean(thinks) == pytest.approx(1.5, rel=0.03)
    assert statistics.median(thinks) == pytest.approx(1.5 * 0.6931, rel=0.05)  # an exponential's median: mean x ln 2


def test_arrival_times_do_not_depend_on_the_prompts() -> None:
    # the prompts' seed differs per compared endpoint, the timing seed does not: only the latter moves times
    assert schedule(spec(shared=10), 2.0, seed=9) == schedule(spec(document=50, think=0.0), 2.0, seed=9)


# --- what a session sends -----------------------------------------------------------------------


def test_the_shared_prompt_opens_every_session_and_the_document_opens_its_first_user_message() -> None:
    src = SessionSource(spec(shared=30, own=6, document=20))
    convs = [src.open(7, i) for i in range(3)]
    firsts = [src.turn(c, 1).body["messages"] for c in convs]
    shared = src.shared_prompt(7)
    assert len(shared.split()) == 30
    for i, (conv, messages) in enumerate(zip(convs, firsts)):
        assert [m["role"] for m in messages] == ["system", "user"]
        system, user = messages[0]["content"], messages[1]["content"]
        assert system.startswith(shared + "\n\nYou are assistant number " + str(i))
        assert user.startswith(conv.document + "\n\n") and len(conv.document.split()) == 20
        assert conv.own_tokens == 5 + 6 + 20 + 8  # own system prompt (with its 5-word lead), document, question
    assert len({c.document for c in convs}) == 3
    assert src.turn(convs[0], 2).body["messages"][1]["content"] == firsts[0][1]["content"]  # the document stays
    assert SessionSource(spec(shared=30)).shared_prompt(8) != shared


# --- the minimum a perfect cache needs ----------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    sessions: list[SessionTrace]
    shared: bool
    minimum: int | None
    common: int


# Shapes: turn t's prompt = previous prompt + previous reply + what is new (template + user message).
CASES = [
    Case("one session, no shared prompt: the first prompt, then what each turn adds",
         [SessionTrace(50, [answer(60, 4), answer(74, 4), answer(88, 4)])], False, 60 + 10 + 10, 0),
    Case("shared prompt counted once: min over sessions of first prompt - own text",
         [SessionTrace(20, [answer(1020, 4), answer(1034)]), SessionTrace(25, [answer(1025, 4), answer(1039)])],
         True, 1000 + 20 + 25 + 10 + 10, 1000),
    Case("without a shared prompt the same numbers count every first prompt whole",
         [SessionTrace(20, [answer(1020, 4), answer(1034)]), SessionTrace(25, [answer(1025, 4), answer(1039)])],
         False, 1020 + 1025 + 10 + 10, 0),
    Case("the template's tokens fall on the shared part: the minimum errs low, never high",
         [SessionTrace(20, [answer(1033)]), SessionTrace(20, [answer(1034)])], True, 1013 + 20 + 21, 1013),
    Case("a session stops at its failed turn: only answered turns count",
         [SessionTrace(10, [answer(110, 4), answer(None, None, error="http_503")]), SessionTrace(10, [answer(110)])],
         True, 100 + 10 + 10, 100),
    Case("a failed first turn: the session adds nothing",
         [SessionTrace(10, [answer(None, None, error="timeout")]), SessionTrace(10, [answer(110)])], True, 110, 100),
    Case("a turn that is somehow shorter than the last prompt + reply adds 0, not a negative",
         [SessionTrace(10, [answer(110, 30), answer(120)])], False, 110, 0),
    Case("an answer without usage counts: no minimum", [SessionTrace(10, [answer(110), answer(None)])], False,
         None, 0),
    Case("no answered turn: no minimum", [SessionTrace(10, [answer(None, error="http_500")])], False, None, 0),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_minimum_prompt_tokens(case: Case) -> None:
    assert minimum_prompt_tokens(case.sessions, case.shared) == (case.minimum, case.common)


def test_computed_is_prompt_minus_cached_and_the_ratio_is_against_the_minimum() -> None:
    sessions = [SessionTrace(20, [answer(1020, 4, cached=0), answer(1034, 4, cached=1023)]),
                SessionTrace(25, [answer(1025, 4, cached=1000), answer(1039, 4, cached=0)])]
    work = prompt_work(sessions, shared=True)
    assert work.prompt_tokens == 1020 + 1034 + 1025 + 1039
    assert work.computed == 1020 + 11 + 25 + 1039
    assert work.minimum == 1065 and work.shared_tokens == 1000
    assert work.ratio == pytest.approx(2095 / 1065)


def test_computed_is_unknown_where_the_endpoint_does_not_report_cached_tokens() -> None:
    sessions = [SessionTrace(20, [answer(1020, 4, cached=0), answer(1034, 4, cached=None)])]
    work = prompt_work(sessions, shared=False)
    assert work.computed is None and work.ratio is None and work.minimum == 1030


@pytest.mark.parametrize(("session", "turn", "url"), [
    (0, 1, "http://a"), (0, 2, "http://b"), (0, 3, "http://a"), (1, 1, "http://b"), (1, 2, "http://a"),
])
def test_a_sessions_turns_alternate_between_the_endpoints(session: int, turn: int, url: str) -> None:
    from gateway.bench.client import Target

    target = Target("A", "http://a", "m", alternates=("http://b",))
    assert target.for_turn(session, turn).base_url == url
    assert target.for_turn(session, turn).alternates == ()
    assert Target("A", "http://a", "m").for_turn(session, turn).base_url == "http://a"
