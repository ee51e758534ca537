"""Multi-turn sessions: each turn sends the whole conversation so far (system prompt, every user
message, every previous assistant reply) plus a new user message, as a chat client does. Engines with
a prefix cache answer a later turn fast only when it lands where the earlier turns were computed,
which is what routing affinity is for.

What a session sends, in order: one system message that holds the system prompt every session
shares (`shared_prefix_tokens`) followed by the session's own (`session_prefix_tokens`); then a
first user message that opens with the session's own document (`document_tokens`) and ends with its
question. The document goes in the user turn, as RAG and chat-with-a-file clients place retrieved
text (and as Anthropic's long-context guide advises: documents at the top of the user turn): every
chat template accepts it there, where many accept one system message only, and the shared system
text stays a byte-identical prefix of every session.

A session's turns run one after another (a turn needs the previous reply), with an optional think
time before each later turn. Sessions start closed-loop (`concurrency` of them in flight, the next
starting when one ends) or open-loop (as a Poisson process of `arrivals` per second, whatever is in
flight). Arrival and think times come from a seed of their own, so every endpoint compared sees the
same times. A failed turn ends its session: the rest of its turns are not sent (a conversation
without the reply it asked for is a different workload), and the level says so.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import aiohttp

from gateway.bench.client import Counter, RequestResult, Target, send
from gateway.bench.load import Level, LevelRun, OnDone, poisson_offsets
from gateway.bench.stats import SessionTrace
from gateway.bench.workload import BenchRequest, Length, synthetic_prompt

SESSION_HEADER = "x-session-id"


@dataclass(frozen=True)
class SessionSpec:
    sessions: int
    turns: int
    session_prefix_tokens: int  # each session's own system prompt, in words (about one token each)
    turn_input: Length  # each user message
    output: Length  # each reply
    session_header: str | None = SESSION_HEADER  # None: send no header
    session_user: bool = True  # send the session id as the OpenAI `user` field
    shared_prefix_tokens: int = 0  # one system prompt every session opens with
    document_tokens: int = 0  # each session's own document, at the start of its first user message
    think_seconds: float = 0.0  # mean pause before each later turn (exponential); 0: none

    def __post_init__(self) -> None:
        if self.sessions < 1 or self.turns < 1:
            raise ValueError("sessions and turns must be at least 1")
        if min(self.session_prefix_tokens, self.shared_prefix_tokens, self.document_tokens) < 0:
            raise ValueError("system prompts and documents must be >= 0 tokens")
        if self.think_seconds < 0:
            raise ValueError("the think time must be >= 0 seconds")

    @property
    def requests(self) -> int:
        return self.sessions * self.turns

    def describe(self) -> str:
        keys = [k for k, on in ((f"header {self.session_header}", self.session_header), ("`user`", self.session_user))
                if on]
        opening = [part for part, n in ((f"a ~{self.shared_prefix_tokens}-token system prompt shared by all",
                                         self.shared_prefix_tokens),
                                        (f"its own ~{self.session_prefix_tokens}-token system prompt",
                                         self.session_prefix_tokens),
                                        (f"its own ~{self.document_tokens}-token document in the first user message",
                                         self.document_tokens)) if n]
        think = f"; ~{self.think_seconds:g} s think time (exponential) before each later turn" if self.think_seconds else ""
        return (f"{self.sessions} sessions x {self.turns} turns, each session with {', '.join(opening) or 'no system prompt'}; "
                f"each turn adds a {self.turn_input}-token user message to the conversation so far "
                f"(previous replies included) and asks for {self.output} tokens{think}; session id in "
                f"{' and '.join(keys) or 'nothing (no session key sent)'}")


@dataclass(frozen=True)
class Schedule:
    """When each session starts and how long it thinks before each later turn, in seconds."""

    starts: list[float] | None  # open loop: offsets from the level's start; None: closed loop
    thinks: list[list[float]]  # per session, the pauses before turns 2..T


def schedule(spec: SessionSpec, arrivals_per_s: float | None, seed: int) -> Schedule:
    """Poisson starts at `arrivals_per_s` (None: closed loop) and exponential think times of mean
    `spec.think_seconds`; each from its own stream of `seed`, so the same seed gives the same times."""
    starts = None
    if arrivals_per_s is not None:
        starts = list(islice(poisson_offsets(arrivals_per_s, random.Random(f"arrivals:{seed}")), spec.sessions))
    rng = random.Random(f"think:{seed}")
    mean = spec.think_seconds
    thinks = [[rng.expovariate(1 / mean) if mean else 0.0 for _ in range(spec.turns - 1)] for _ in range(spec.sessions)]
    return Schedule(starts, thinks)


@dataclass
class Conversation:
    session_id: str
    rng: random.Random
    messages: list[dict[str, Any]] = field(default_factory=list)
    document: str = ""  # opens the first user message
    own_tokens: int = 0  # words of the first prompt beyond the shared system prompt (grows with turn 1)


def _words(text: str) -> int:
    return len(text.split())


class SessionSource:
    """Builds each session's conversation; the same seed gives the same system prompts, documents and
    user messages, so endpoints compared side by side see the same opening work."""

    def __init__(self, spec: SessionSpec) -> None:
        self.spec = spec

    def shared_prompt(self, seed: int) -> str:
        return synthetic_prompt(random.Random(f"shared:{seed}"), self.spec.shared_prefix_tokens)

    def open(self, seed: int, index: int) -> Conversation:
        rng = random.Random(seed * 1_000_003 + index)
        conv = Conversation(f"bench-{seed:x}-{index}", rng)
        own = ""
        if self.spec.session_prefix_tokens:
            own = f"You are assistant number {index}. " + synthetic_prompt(rng, self.spec.session_prefix_tokens)
        if self.spec.document_tokens:
            conv.document = synthetic_prompt(rng, self.spec.document_tokens)
        system = "\n\n".join(part for part in (self.shared_prompt(seed) if self.spec.shared_prefix_tokens else "",
                                                own) if part)
        if system:
            conv.messages.append({"role": "system", "content": system})
        conv.own_tokens = _words(own) + _words(conv.document)
        return conv

    def turn(self, conv: Conversation, turn: int) -> BenchRequest:
        """The next request of `conv` (turn is 1-based); the user message joins the conversation."""
        user = synthetic_prompt(conv.rng, self.spec.turn_input.sample(conv.rng))
        if turn == 1:
            conv.own_tokens += _words(user)
            if conv.document:
                user = f"{conv.document}\n\n{user}"
        conv.messages.append({"role": "user", "content": user})
        body: dict[str, Any] = {"messages": [dict(m) for m in conv.messages]}
        if self.spec.session_user:
            body["user"] = conv.session_id
        headers = {self.spec.session_header: conv.session_id} if self.spec.session_header else {}
        text = "\n".join(str(m["content"]) for m in conv.messages)
        return BenchRequest(body, self.spec.output.sample(conv.rng), text, headers=headers, keep_text=True, turn=turn)

    @staticmethod
    def answered(conv: Conversation, result: RequestResult) -> None:
        conv.messages.append({"role": "assistant", "content": result.text or ""})


@dataclass
class SessionRun(LevelRun):
    ended_early: int = 0  # sessions stopped by a failed turn
    unsent: int = 0  # their turns that were never sent
    traces: list[SessionTrace] = field(default_factory=list)  # one per session that started, in index order


async def run_sessions(session: aiohttp.ClientSession, target: Target, source: SessionSource, level: Level,
                       seed: int, counter: Counter | None = None, on_done: OnDone | None = None,
                       timing_seed: int | None = None) -> SessionRun:
    """Every session of `source.spec`: `level.value` sessions in flight at once (kind "concurrency",
    closed loop) or starting at `level.value` per second (kind "arrivals", open loop). `seed` draws the
    prompts, `timing_seed` (default `seed`) the arrival and think times."""
    if level.kind not in ("concurrency", "arrivals"):
        raise ValueError("multi-turn sessions run closed-loop (sessions in flight) or open-loop (sessions "
                         "arriving per second), not at a request rate")
    if target.endpoint != "chat":
        raise ValueError("multi-turn sessions need the chat endpoint (a conversation is a list of messages)")
    spec = source.spec
    plan = schedule(spec, level.value if level.kind == "arrivals" else None, seed if timing_seed is None else timing_seed)
    results: list[RequestResult] = []
    traces: dict[int, SessionTrace] = {}
    ended_early = unsent = 0
    cpu0, start = time.process_time(), time.perf_counter()

    async def converse(index: int) -> None:
        nonlocal ended_early, unsent
        conv = source.open(seed, index)
        trace = traces[index] = SessionTrace(0)
        for turn in range(1, spec.turns + 1):
            if turn > 1 and plan.thinks[index][turn - 2]:
                await asyncio.sleep(plan.thinks[index][turn - 2])
            request = source.turn(conv, turn)
            trace.own_tokens = conv.own_tokens
            result = await send(session, target.for_turn(index, turn), request, counter)
            results.append(result)
            trace.results.append(result)
            if on_done is not None:
                on_done(result)
            if not result.ok:
                ended_early += 1
                unsent += spec.turns - turn
                return
            source.answered(conv, result)

    if plan.starts is None:
        pending = iter(range(spec.sessions))

        async def worker() -> None:
            for index in pending:  # one shared iterator: each session is taken by exactly one worker
                await converse(index)

        await asyncio.gather(*(worker() for _ in range(min(int(level.value), spec.sessions))))
    else:
        async def arrive(index: int, offset: float) -> None:
            delay = start + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await converse(index)

        await asyncio.gather(*(arrive(i, offset) for i, offset in enumerate(plan.starts)))
    return SessionRun(level, results, time.perf_counter() - start, time.process_time() - cpu0, ended_early, unsent,
                      [traces[i] for i in sorted(traces)])
