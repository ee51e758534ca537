"""A small adapter behind the real contract, for API-layer unit tests (no engine)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson

from adapters.base import (
    Adapter,
    Capabilities,
    Completion,
    EngineError,
    Health,
    RequestContext,
    StreamEvent,
    Usage,
)


class EchoAdapter(Adapter):
    """Answers with the words of the last message, one event per word.

    `gate` (when set) makes every generation wait until the test opens it, to hold a slot.
    `fail_after` raises EngineError mid-stream after that many words.
    """

    engine = "echo"
    capabilities = Capabilities(chat=True, completions=True, embeddings=False)

    def __init__(self, gate: asyncio.Event | None = None, fail_after: int | None = None) -> None:
        self.gate = gate
        self.fail_after = fail_after
        self.closed_streams = 0
        self.completed_streams = 0
        self.seen_bodies: list[dict[str, Any]] = []

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def health(self) -> Health:
        return Health(ready=True)

    def _words(self, body: dict[str, Any]) -> list[str]:
        if "messages" in body:
            return str(body["messages"][-1].get("content") or "").split()
        return str(body.get("prompt")).split()

    async def chat(self, body: dict[str, Any], ctx: RequestContext) -> Completion | AsyncIterator[StreamEvent]:
        self.seen_bodies.append(body)
        if self.gate is not None:
            await self.gate.wait()
        words = self._words(body)
        usage = Usage(prompt_tokens=len(words), completion_tokens=len(words))
        if body.get("stream"):
            return self._stream(words, ctx, usage)
        return Completion(
            body={
                "id": f"chatcmpl-{ctx.request_id}",
                "object": "chat.completion",
                "created": 0,
                "model": ctx.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": " ".join(words)}, "finish_reason": "stop"}],
                "usage": usage.as_dict(),
            },
            usage=usage,
        )

    completions = chat

    async def _stream(self, words: list[str], ctx: RequestContext, usage: Usage) -> AsyncIterator[StreamEvent]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            return orjson.dumps({"id": "x", "object": "chat.completion.chunk", "created": 0, "model": ctx.model,
                                 "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

        try:
            yield StreamEvent(data=chunk({"role": "assistant"}))
            for i, word in enumerate(words):
                if self.fail_after is not None and i == self.fail_after:
                    raise EngineError("engine died", status=502)
                await asyncio.sleep(0)
                yield StreamEvent(data=chunk({"content": word + " "}), has_content=True)
            yield StreamEvent(data=chunk({}, "stop"), finish_reason="stop")
            data = orjson.dumps({"choices": [], "usage": usage.as_dict()}) if ctx.include_usage else b""
            yield StreamEvent(data=data, usage=usage)
            self.completed_streams += 1
        finally:
            self.closed_streams += 1
