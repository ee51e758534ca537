"""The contract of a precise cache view: the engine's own record of the KV blocks it holds.

A replica whose engine publishes its KV cache events (vLLM `--kv-events-config`) gets one; the
router asks it, before choosing, how many tokens of a request's prompt that engine holds now, and
uses the answer in place of its approximate index's guess.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class PreciseCache(Protocol):
    async def start(self) -> None:
        """Subscribe to the engine's events (returns at once; the subscription runs in a task)."""

    async def stop(self) -> None: ...

    async def matched_tokens(self, body: Mapping[str, Any], path: str) -> int | None:
        """Leading tokens of this request's prompt (chat `messages` or completion `prompt`; `path` is the
        OpenAI route) that the engine holds in its KV cache now; None when it cannot tell (not
        subscribed yet, tokenizing failed): the router then falls back to its approximate index."""

    def reset(self) -> None:
        """The engine restarted: it holds nothing."""

    @property
    def answering(self) -> bool:
        """Whether it can answer now (subscribed, caught up with the engine's current launch)."""

    async def tokens(self, body: Mapping[str, Any], path: str) -> list[int] | None:
        """The request's prompt as the engine tokenizes it; replicas of one model tokenize alike, so the
        router tokenizes once and asks each replica's view to `matched` the tokens."""

    def matched(self, tokens: Sequence[int]) -> int | None:
        """Leading tokens of these prompt tokens the engine holds now; None when it cannot tell."""
