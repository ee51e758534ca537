"""An engine that dies right after sending tokens: the client still gets those tokens, then the
error event, through either HTTP client. (aiohttp raises a broken connection before handing over
what it had buffered.)"""

from __future__ import annotations

import asyncio

import orjson
import pytest

from adapters.base import RequestContext
from adapters.openai_http import AiohttpClient, HttpClient, HttptoolsClient, Relay, Upstream

CHUNK = b'data: {"choices": [{"index": 0, "delta": {"content": "tok%d"}, "finish_reason": null}]}\n\n'


def _broken(resp: object) -> bool:
    """Whether the client side has seen the break (each client's own state)."""
    inner = getattr(resp, "_resp", None)
    if inner is not None:
        return inner.content.exception() is not None  # type: ignore[no-any-return]
    return resp._conn.error is not None  # type: ignore[attr-defined, no-any-return]


@pytest.mark.parametrize("make_client", [HttptoolsClient, AiohttpClient], ids=["httptools", "aiohttp"])
async def test_tokens_sent_before_the_engine_died_reach_the_client(make_client: type[HttpClient]) -> None:
    closed = asyncio.Event()

    async def dying_engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (await reader.readline()) not in (b"\r\n", b""):
            pass  # headers
        await reader.read(65536)  # the small JSON body
        body = b"".join(CHUNK % i for i in range(2))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                     + b"%x\r\n" % len(body) + body + b"\r\n")  # no final chunk: the engine died
        await writer.drain()
        writer.transport.abort()
        closed.set()

    server = await asyncio.start_server(dying_engine, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    relay = Relay("dying", client=make_client())
    try:
        events = await relay.stream(Upstream(f"http://127.0.0.1:{port}"), "/v1/chat/completions",
                                    {"model": "m", "stream": True}, RequestContext("r", "m"))
        await closed.wait()
        # before the first read, the client side has both the tokens and the break
        resp = events.ag_frame.f_locals["resp"]  # type: ignore[attr-defined]
        deadline = asyncio.get_running_loop().time() + 10
        while not _broken(resp):
            assert asyncio.get_running_loop().time() < deadline, "the break never arrived"
            await asyncio.sleep(0.01)
        received = [e async for e in events]
    finally:
        await relay.aclose()
        server.close()
        await server.wait_closed()
    contents = [orjson.loads(e.data)["choices"][0]["delta"]["content"] for e in received[:-1]]
    assert contents == ["tok0", "tok1"]
    assert received[-1].is_error and orjson.loads(received[-1].data)["error"]["code"] == "engine_disconnected"
