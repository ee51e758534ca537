"""adapters/http_client.py against real sockets: framing, keep-alive reuse, resend on a closed
kept-alive connection, connection errors, cancellation closing the connection, backpressure."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import pytest

from adapters.http_client import (
    HIGH_WATER,
    HttptoolsClient,
    UpstreamConnectionError,
    UpstreamDisconnected,
)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """The request's head and its Content-Length body."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
    return head, await reader.readexactly(length)


OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
"""The engine's short answer, keep-alive (HTTP/1.1's default)."""


async def request_ok(client: HttptoolsClient, url: str) -> None:
    """One POST answered "ok", its connection given back for reuse."""
    resp = await client.request("POST", url + "/", {}, b"{}")
    assert await resp.read() == b"ok"
    resp.release()


async def serve(handler: Handler) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


@pytest.mark.parametrize("response, body", [
    (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello", b"hello"),
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nhel\r\n2\r\nlo\r\n0\r\n\r\n", b"hello"),
    (b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nhello", b"hello"),  # until the connection closes
    (b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n", b""),
])
async def test_bodies_by_length_chunks_and_close(response: bytes, body: bytes) -> None:
    seen: list[tuple[bytes, bytes]] = []

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(response)
        await writer.drain()
        writer.close()

    server, url = await serve(engine)
    client = HttptoolsClient()
    try:
        resp = await client.request("POST", url + "/v1/x?a=1", {"X-Request-Id": "r1"}, b'{"m": 1}')
        assert (resp.status, await resp.read()) == (int(response.split()[1]), body)
        resp.release()
    finally:
        await client.aclose()
        server.close()
    head, sent = seen[0]
    assert head.startswith(b"POST /v1/x?a=1 HTTP/1.1\r\n") and b"\r\nX-Request-Id: r1\r\n" in head
    assert b"\r\nHost: 127.0.0.1:" in head and b"\r\nContent-Length: 8\r\n" in head and sent == b'{"m": 1}'


async def test_a_configured_host_header_replaces_the_urls() -> None:
    heads: list[bytes] = []

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append((await read_request(reader))[0])
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server, url = await serve(engine)
    client = HttptoolsClient()
    try:
        resp = await client.request("GET", url + "/", {"Host": "engine.internal"}, None)
        await resp.read()
        resp.release()
    finally:
        await client.aclose()
        server.close()
    assert heads[0].lower().count(b"\r\nhost:") == 1 and b"\r\nHost: engine.internal\r\n" in heads[0]


async def test_a_released_connection_is_reused_and_an_aborted_one_is_not() -> None:
    connections = 0

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            while True:
                await read_request(reader)
                writer.write(OK)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server, url = await serve(engine)
    client = HttptoolsClient()
    try:
        for _ in range(3):
            await request_ok(client, url)
        assert connections == 1
        resp = await client.request("POST", url + "/", {}, b"{}")
        resp.abort()
        resp = await client.request("POST", url + "/", {}, b"{}")
        assert await resp.read() == b"ok"
        assert connections == 2
    finally:
        await client.aclose()
        server.close()


async def test_a_kept_alive_connection_the_engine_closed_is_resent_once() -> None:
    """Like llama-server: keep-alive advertised, the connection closed after each response."""
    requests = 0

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        await read_request(reader)
        requests += 1
        writer.write(OK)
        await writer.drain()
        try:
            await read_request(reader)  # the second request on this connection: closed unanswered
        except asyncio.IncompleteReadError:
            pass
        writer.transport.abort()

    server, url = await serve(engine)
    client = HttptoolsClient(keepalive=60)
    try:
        for _ in range(3):
            await request_ok(client, url)
        assert requests == 3
    finally:
        await client.aclose()
        server.close()


async def test_an_engine_dying_with_every_request_is_disconnected_not_retried_forever() -> None:
    """On a fresh connection nothing can be stale: a close before the response is the engine failing, and
    the request is not sent again. On a kept-alive one it is resent once, on a fresh connection."""
    tries = 0
    answer = True

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal tries
        while True:
            await read_request(reader)
            tries += 1
            if not answer:
                writer.transport.abort()
                return
            writer.write(OK)
            await writer.drain()

    server, url = await serve(engine)
    client = HttptoolsClient(keepalive=60)
    try:
        answer = False
        with pytest.raises(UpstreamDisconnected) as fresh:
            await client.request("POST", url + "/", {}, b"{}")
        assert tries == 1 and "resent" not in str(fresh.value)
        answer = True
        await request_ok(client, url)  # kept alive
        answer, tries = False, 0
        with pytest.raises(UpstreamDisconnected, match="resent"):
            await client.request("POST", url + "/", {}, b"{}")
        assert tries == 2
    finally:
        await client.aclose()
        server.close()


async def test_a_request_that_kills_the_engine_on_a_kept_alive_connection_is_a_reset_not_refused() -> None:
    """The request reached the engine and the engine is gone: the resend finds nothing listening, and the
    answer is the disconnect (engine_reset upstream), not "cannot connect" (the engine unreachable)."""
    served = 0

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal served
        await read_request(reader)
        served += 1
        writer.write(OK)
        await writer.drain()
        await read_request(reader)
        server.close()  # the engine dies with the second request: its port is closed
        writer.transport.abort()

    server, url = await serve(engine)
    client = HttptoolsClient(keepalive=60)
    try:
        await request_ok(client, url)
        with pytest.raises(UpstreamDisconnected, match="no longer accepts connections"):
            await client.request("POST", url + "/", {}, b"{}")
        assert served == 1
    finally:
        await client.aclose()
        server.close()


async def test_nothing_listening_and_malformed_responses_are_connection_errors() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: refused
    client = HttptoolsClient()
    with pytest.raises(UpstreamConnectionError, match="cannot connect") as refused:
        await client.request("GET", f"http://127.0.0.1:{port}/", {}, None)
    assert not isinstance(refused.value, UpstreamDisconnected)

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nokSMTP junk\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n")
        await writer.drain()

    server, url = await serve(garbage)
    try:
        resp = await client.request("GET", url + "/", {}, None)
        assert await resp.read() == b"okSM"
        resp.release()  # the junk after the body: the connection is not kept
        assert not client._idle.get(("http", "127.0.0.1", server.sockets[0].getsockname()[1]))
    finally:
        await client.aclose()
        server.close()
    with pytest.raises(UpstreamConnectionError, match="unsupported URL"):
        await client.request("GET", "ftp://host/x", {}, None)
    with pytest.raises(ValueError):
        await client.request("GET", url + "/", {"X-Bad": "a\r\nInjected: 1"}, None)


@pytest.mark.parametrize("ended_by", ["cancellation", "deadline"])
async def test_a_request_cancelled_or_past_its_deadline_closes_its_connection(ended_by: str) -> None:
    closed = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        if await reader.read(1) == b"":  # the client hung up: the engine sees the request cancelled
            closed.set()
        writer.close()

    server, url = await serve(silent)
    client = HttptoolsClient()
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(TimeoutError):
            if ended_by == "cancellation":
                async with asyncio.timeout(0.2):
                    await client.request("POST", url + "/", {}, b"{}")
            else:
                await client.request("POST", url + "/", {}, b"{}", deadline=started + 0.2)
        assert loop.time() - started >= 0.2
        await closed.wait()
        assert not client._idle.get(client._split(url + "/")[0])  # nothing half-read back in the pool
    finally:
        await client.aclose()
        server.close()


async def test_a_read_deadline_bounds_each_wait_and_bytes_already_there_never_time_out() -> None:
    go_on = asyncio.Event()

    async def pauses(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        await go_on.wait()
        writer.write(b"3\r\ndef\r\n0\r\n\r\n")
        await writer.drain()

    server, url = await serve(pauses)
    client = HttptoolsClient()
    try:
        loop = asyncio.get_running_loop()
        resp = await client.request("GET", url + "/", {}, None, deadline=loop.time() + 5)
        await asyncio.sleep(0.1)  # "abc" has arrived
        assert await resp.read_chunk(deadline=loop.time() - 1) == b"abc"  # there already: no wait, no timeout
        with pytest.raises(TimeoutError):
            await resp.read_chunk(deadline=loop.time() + 0.1)  # the engine pauses past it
        go_on.set()
        assert await resp.read(deadline=loop.time() + 5) == b"def"  # a timed-out wait leaves the response readable
        resp.abort()
    finally:
        await client.aclose()
        server.close()


async def test_a_slow_reader_pauses_the_connection_and_gets_every_byte() -> None:
    total = 64 * HIGH_WATER  # past what loopback's socket buffers hold
    sent = asyncio.Event()

    async def firehose(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % total)
        block = b"x" * 65536
        for _ in range(total // len(block)):
            writer.write(block)
            await writer.drain()  # blocks while the client does not read
        sent.set()

    server, url = await serve(firehose)
    client = HttptoolsClient()
    try:
        resp = await client.request("GET", url + "/", {}, None)
        await asyncio.sleep(0.3)  # the client reads nothing for a while
        assert not sent.is_set(), "the engine could send everything: nothing held it back"
        assert resp._conn.size < 4 * HIGH_WATER  # paused near the mark, not the whole body in memory
        got = 0
        while chunk := await resp.read_chunk():
            got += len(chunk)
        assert got == total
        resp.release()
    finally:
        await client.aclose()
        server.close()
