"""Multi-turn sessions: each session opens with its own system prompt, and each turn sends the whole
conversation so far (system prompt, every user message, every previous assistant reply) plus a new
user message, as a chat client does. Engines with a prefix cache answer a later turn fast only when
it lands where the earlier turns were computed, which is what routing affinity is for.

A session's turns run one after another (a turn needs the previous reply); sessions run side by
side, `concurrency` of them at once. A failed turn ends its session: the rest of its turns are not
sent (a conversation without the reply it asked for is a different workload), and the level says so.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from gateway.bench.client import Counter, RequestResult, Target, send
from gateway.bench.load import Level, LevelRun, OnDone
from gateway.bench.workload import BenchRequest, Length, synthetic_prompt

SESSION_HEADER = "x-session-id"


@dataclass(frozen=True)
class SessionSpec:
    sessions: int
    turns: int
    prefix_tokens: int  # each session's own system prompt, in words (about one token each)
    turn_input: Length  # each user message
    output: Length  # each reply
    session_header: str | None = SESSION_HEADER  # None: send no header
    session_user: bool = True  # send the session id as the OpenAI `user` field

    def __post_init__(self) -> None:
        if self.sessions < 1 or self.turns < 1:
            raise ValueError("sessions and turns must be at least 1")
        if self.prefix_tokens < 0:
            raise ValueError("the shared prefix must be >= 0 tokens")

    @property
    def requests(self) -> int:
        return self.sessions * self.turns

    def describe(self) -> str:
        keys = [k for k, on in ((f"header {self.session_header}", self.session_header), ("`user`", self.session_user))
                if on]
        return (f"{self.sessions} sessions x {self.turns} turns, each session with its own ~{self.prefix_tokens}-token "
                f"system prompt; each turn adds a {self.turn_input}-token user message to the conversation so far "
                f"(previous replies included) and asks for {self.output} tokens; session id in "
                f"{' and '.join(keys) or 'nothing (no session key sent)'}")


@dataclass
class Conversation:
    session_id: str
    rng: random.Random
    messages: list[dict[str, Any]] = field(default_factory=list)


class SessionSource:
    """Builds each session's conversation; the same seed gives the same system prompts and user
    messages, so endpoints compared side by side see the same opening work."""

    def __init__(self, spec: SessionSpec) -> None:
        self.spec = spec

    def open(self, seed: int, index: int) -> Conversation:
        rng = random.Random(seed * 1_000_003 + index)
        conv = Conversation(f"bench-{seed:x}-{index}", rng)
        if self.spec.prefix_tokens:
            prompt = f"You are assistant number {index}. " + synthetic_prompt(rng, self.spec.prefix_tokens)
            conv.messages.append({"role": "system", "content": prompt})
        return conv

    def turn(self, conv: Conversation, turn: int) -> BenchRequest:
        """The next request of `conv` (turn is 1-based); the user message joins the conversation."""
        user = synthetic_prompt(conv.rng, self.spec.turn_input.sample(conv.rng))
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


async def run_sessions(session: aiohttp.ClientSession, target: Target, source: SessionSource, level: Level,
                       seed: int, counter: Counter | None = None, on_done: OnDone | None = None) -> SessionRun:
    """Every session of `source.spec`, `level.value` sessions in flight at once (closed loop)."""
    if level.kind != "concurrency":
        raise ValueError("multi-turn sessions run closed-loop: give a concurrency (sessions in flight), not a rate")
    if target.endpoint != "chat":
        raise ValueError("multi-turn sessions need the chat endpoint (a conversation is a list of messages)")
    spec = source.spec
    results: list[RequestResult] = []
    ended_early = unsent = 0
    pending = iter(range(spec.sessions))
    cpu0, start = time.process_time(), time.perf_counter()

    async def converse(index: int) -> None:
        nonlocal ended_early, unsent
        conv = source.open(seed, index)
        for turn in range(1, spec.turns + 1):
            result = await send(session, target, source.turn(conv, turn), counter)
            results.append(result)
            if on_done is not None:
                on_done(result)
            if not result.ok:
                ended_early += 1
                unsent += spec.turns - turn
                return
            source.answered(conv, result)

    async def worker() -> None:
        for index in pending:  # one shared iterator: each session is taken by exactly one worker
            await converse(index)

    await asyncio.gather(*(worker() for _ in range(min(int(level.value), spec.sessions))))
    return SessionRun(level, results, time.perf_counter() - start, time.process_time() - cpu0, ended_early, unsent)
