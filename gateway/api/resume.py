"""A preemptible stream: cut where the scheduler took its slot back, resumed on the next free one.

Concurrency rule: runs in the request's task. The admission marks the stream's ticket `preempted` (and
hands its slot to a newcomer) on the event loop; the stream sees the mark after the event it is waiting
for, closes its engine request, releases its lease (which counts nothing: the slot is already gone), and
asks for a slot again as `resumed` (first of its flow), with the text it sent. The held lease and
attempt (`Held`) are the current segment's: `_sse` reports and releases those at the end."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from adapters.base import ChatResult, Completion, Operation, StreamEvent
from adapters.upstream_errors import error_event
from gateway.preemption import Splice, resume_body
from gateway.routing import Lease
from gateway.tracing import spans

Again = Callable[[dict[str, Any], int], Awaitable[tuple[Lease, ChatResult, "spans.Attempt | None"]]]
"""Admit and send the resumed body (the second argument: tokens it adds to the prompt)."""


@dataclass(slots=True)
class Held:
    """The lease and trace attempt of the segment streaming now."""

    lease: Lease
    attempt: spans.Attempt | None = None


async def resumable(events: AsyncIterator[StreamEvent], held: Held, operation: Operation, body: dict[str, Any],
                    again: Again, on_preempted: Callable[[], None]) -> AsyncIterator[StreamEvent]:
    splice = Splice(operation)
    pinned = False
    try:
        while True:
            first = True
            async for event in events:
                out = splice.take(event)
                if first and event.has_content and splice.segments > 1:
                    first = False
                    held.lease.prefilled()
                if not pinned and not splice.can_resume:
                    pinned = True
                    held.lease.pin()
                if out is not None:
                    yield out
                ticket = held.lease.ticket
                if ticket is not None and ticket.preempted and splice.can_resume:
                    break
            else:
                return
            await events.aclose()
            if held.attempt is not None:
                held.attempt.stream_ended(None, "preempted", None, True, None)
            held.lease.release()
            on_preempted()
            lease, result, attempt = await again(resume_body(operation, body, splice.text, splice.produced),
                                                 splice.produced)
            held.lease, held.attempt = lease, attempt
            splice.resumed()
            if isinstance(result, Completion):  # the engine answered the resume with an error status
                yield error_event(f"the engine refused to resume the stream after a preemption (HTTP {result.status})",
                                  "engine_error")
                return
            events = result
    finally:
        await events.aclose()  # type: ignore[attr-defined]

