"""GET /admin/requests/stream's response, driven as ASGI: rows as they finish, filtered by who asks; it
ends cleanly when the client leaves and when the ring closes (the drain's start: an `event: end`)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from gateway.api.admin_requests import LiveRows
from gateway.identity import Caller
from gateway.recent import Filters, RecentRequests, RequestFacts


def facts(i: int, tenant: str | None) -> RequestFacts:
    f = RequestFacts(f"id{i}", 1.0, "/v1/chat/completions", 0.0)
    f.tenant, f.status = tenant, 200
    return f


async def run(ring: RecentRequests, caller: Caller | None) -> tuple[asyncio.Task[None], list[bytes], asyncio.Event]:
    sent: list[bytes] = []
    gone = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            sent.append(message["body"])

    task = asyncio.ensure_future(LiveRows(ring, caller, Filters())({"type": "http"}, receive, send))
    while not sent:
        await asyncio.sleep(0)
    return task, sent, gone


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_rows_stream_to_their_tenant_and_the_stream_ends_when_the_client_leaves() -> None:
    ring = RecentRequests(10)
    task, sent, gone = await run(ring, Caller("a"))
    ring.record(facts(1, "a"))
    ring.record(facts(2, "b"))  # another tenant's: never sent to a
    await settle()
    ring.record(facts(3, "a"))
    await settle()
    rows = [orjson.loads(chunk.removeprefix(b"data: ")) for chunk in b"".join(sent).split(b"\n\n")
            if chunk.startswith(b"data: ")]
    assert [r["id"] for r in rows] == ["id1", "id3"]
    gone.set()
    await asyncio.wait_for(task, 5)  # a hang guard only
    assert ring.subscribers == 0 and sent[-1] == b""


async def test_closing_the_ring_ends_every_stream_with_an_end_event() -> None:
    ring = RecentRequests(10)
    task, sent, _ = await run(ring, None)
    ring.close()
    await asyncio.wait_for(task, 5)
    assert b'event: end\ndata: {"reason": "shutdown"}' in b"".join(sent) and sent[-1] == b""


async def test_another_tenants_rows_neither_wake_nor_ping_a_stream() -> None:
    ring = RecentRequests(10)
    task, sent, gone = await run(ring, Caller("a"))
    for i in range(5):
        ring.record(facts(i, "b"))  # a ping per batch of b's rows would time each of b's requests for a
    await settle()
    assert sent == [b": live\n\n"]
    gone.set()
    await asyncio.wait_for(task, 5)
