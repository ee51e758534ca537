"""Rewriting a streamed chat completion one parsed chunk at a time.

Events without choices to rewrite (empty, errors, the usage-only chunk) pass through untouched; the
upstream iterator is closed when the consumer stops, whichever way it stops.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from adapters.base import StreamEvent

ChunkRewrite = Callable[[dict[str, Any], StreamEvent], "StreamEvent | None"]
"""A parsed chunk and the event it came in -> the event to send (None: nothing to send yet)."""


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


async def rewrite_chunks(events: AsyncIterator[StreamEvent], rewrite: ChunkRewrite) -> AsyncIterator[StreamEvent]:
    try:
        async for event in events:
            if not event.data or event.is_error or b'"choices":[]' in event.data:
                yield event
                continue
            out = rewrite(orjson.loads(event.data), event)
            if out is not None:
                yield out
    finally:
        await events.aclose()  # type: ignore[attr-defined]
