"""Which HTTP client should the relay hold? The same relay (adapters.openai_http.Relay) over each.

    python -m benchmarks.relay_clients [--requests 3000] [--rounds 2]

Clients: the relay's own (httptools on asyncio protocols, adapters/http_client.py), aiohttp,
httpx, httpx over aiohttp, and aiosonic when it is importable (not a dependency of the project:
`pip install --target DIR aiosonic` and PYTHONPATH=DIR to include it).

Each client runs inside a minimal plain-ASGI relay app under uvicorn (uvloop + httptools, one
worker), in front of a fast engine emulator on loopback. Reports non-streaming latency at
concurrency 1, requests/s at concurrency 32, and streamed requests/s at concurrency 32.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Mapping
from typing import Any

import httpx
import orjson

from adapters.base import Completion, RequestContext
from adapters.openai_http import AiohttpClient, HttpClient, HttptoolsClient, Relay, Upstream, UpstreamConnectionError, UpstreamResponse
from benchmarks.harness import BODY, load, spawn, stop, wait_http
from tests.emulators.fixture import free_port

CLIENTS = ("httptools", "aiohttp", "httpx", "httpx-aiohttp", "aiosonic")


class _HttpxResponse:
    def __init__(self, resp: httpx.Response) -> None:
        self._resp = resp
        self.status = resp.status_code
        self._chunks = resp.aiter_raw()

    async def read(self, deadline: float | None = None) -> bytes:
        async with asyncio.timeout_at(deadline):
            return await self._resp.aread()

    async def read_chunk(self, deadline: float | None = None) -> bytes:
        try:
            async with asyncio.timeout_at(deadline):
                return await self._chunks.__anext__()
        except StopAsyncIteration:
            return b""
        except httpx.TransportError as exc:
            raise UpstreamConnectionError(str(exc)) from exc

    def release(self) -> None:
        if not self._resp.is_closed:
            asyncio.ensure_future(self._resp.aclose())

    abort = release


class HttpxClient:
    """httpx.AsyncClient, on its own transport or on httpx-aiohttp's AiohttpTransport."""

    def __init__(self, over_aiohttp: bool = False) -> None:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=1000)
        transport: httpx.AsyncBaseTransport | None = None
        if over_aiohttp:
            from httpx_aiohttp import AiohttpTransport

            transport = AiohttpTransport(limits=limits)
        self._client = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(None, connect=10.0), transport=transport)

    async def request(self, method: str, url: str, headers: Mapping[str, str], body: bytes | None,
                      deadline: float | None = None) -> UpstreamResponse:
        try:
            async with asyncio.timeout_at(deadline):
                resp = await self._client.send(self._client.build_request(method, url, headers=headers, content=body), stream=True)
        except httpx.TransportError as exc:
            raise UpstreamConnectionError(str(exc)) from exc
        return _HttpxResponse(resp)

    async def aclose(self) -> None:
        await self._client.aclose()


class _AiosonicResponse:
    def __init__(self, resp: Any) -> None:
        self._resp = resp
        self.status = resp.status_code
        self._chunks = resp.read_chunks()

    async def read(self, deadline: float | None = None) -> bytes:
        async with asyncio.timeout_at(deadline):
            return await self._resp.content()  # type: ignore[no-any-return]

    async def read_chunk(self, deadline: float | None = None) -> bytes:
        try:
            async with asyncio.timeout_at(deadline):
                return await self._chunks.__anext__()  # type: ignore[no-any-return]
        except StopAsyncIteration:
            return b""

    def release(self) -> None:
        pass

    abort = release


class AiosonicClient:
    def __init__(self) -> None:
        import aiosonic

        self._client = aiosonic.HTTPClient()

    async def request(self, method: str, url: str, headers: Mapping[str, str], body: bytes | None,
                      deadline: float | None = None) -> UpstreamResponse:
        try:
            async with asyncio.timeout_at(deadline):
                resp = await self._client.request(url, method, headers=dict(headers), data=body, stream=True)
        except OSError as exc:
            raise UpstreamConnectionError(str(exc)) from exc
        return _AiosonicResponse(resp)

    async def aclose(self) -> None:
        pass


def available(name: str) -> bool:
    if name != "aiosonic":
        return True
    try:
        import aiosonic  # noqa: F401
    except ImportError:
        return False
    return True


def make_client(name: str) -> HttpClient:
    if name == "httptools":
        return HttptoolsClient()
    if name == "aiosonic":
        return AiosonicClient()
    if name == "aiohttp":
        return AiohttpClient()
    if name == "httpx":
        return HttpxClient()
    if name == "httpx-aiohttp":
        return HttpxClient(over_aiohttp=True)
    raise ValueError(name)


def relay_app(client: str, upstream_url: str) -> Any:
    upstream = Upstream(upstream_url)
    state: dict[str, Relay] = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    state["relay"] = Relay("emulator", client=make_client(client))
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await state["relay"].aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["path"] == "/health":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        body = orjson.loads(raw)
        ctx = RequestContext("bench", "emulated-model")
        result = await state["relay"].forward(upstream, "/v1/chat/completions", body, ctx)
        if isinstance(result, Completion):
            assert isinstance(result.body, bytes)
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": result.body})
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        async for event in result:
            if event.data:
                await send({"type": "http.response.body", "body": b"data: " + event.data + b"\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    return app


def serve(client: str, port: int, upstream: str) -> int:
    import uvicorn

    uvicorn.run(relay_app(client, upstream), host="127.0.0.1", port=port, loop="uvloop", http="httptools",
                log_level="warning", access_log=False, lifespan="on")
    return 0


async def measure(url: str, requests: int) -> dict[str, float]:
    await load(url, 8, 200)  # warm-up: connections, caches
    c1 = await load(url, 1, max(200, requests // 5))
    c32 = await load(url, 32, requests)
    s32 = await load(url, 32, requests // 2, {**BODY, "stream": True})
    return {"p50_ms": c1.p50_ms, "p99_ms": c1.p99_ms, "rps32": c32.rps, "stream_rps32": s32.rps}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--serve", choices=CLIENTS, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--upstream", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        return serve(args.serve, args.port, args.upstream)

    emu_port = free_port()
    emulator = spawn(["tests.emulators.engine_emulator", "--style", "vllm", "--port", str(emu_port), "--tokens", "16"])
    results: dict[str, list[dict[str, float]]] = {c: [] for c in CLIENTS if available(c)}
    try:
        wait_http(f"http://127.0.0.1:{emu_port}/health", emulator)
        direct = asyncio.run(measure(f"http://127.0.0.1:{emu_port}/v1/chat/completions", args.requests))
        for _ in range(args.rounds):
            for client in results:
                port = free_port()
                relay = spawn(["benchmarks.relay_clients", "--serve", client, "--port", str(port),
                               "--upstream", f"http://127.0.0.1:{emu_port}"])
                try:
                    wait_http(f"http://127.0.0.1:{port}/health", relay)
                    results[client].append(asyncio.run(measure(f"http://127.0.0.1:{port}/", args.requests)))
                finally:
                    stop(relay)
    finally:
        stop(emulator)
    print("| relay client | p50 ms (c=1) | p99 ms (c=1) | req/s (c=32) | streamed req/s (c=32) |")
    print("|---|---|---|---|---|")
    print(f"| none (direct to emulator) | {direct['p50_ms']:.2f} | {direct['p99_ms']:.2f} | {direct['rps32']:.0f} | {direct['stream_rps32']:.0f} |")
    for client, runs in results.items():
        best = {k: (min if k.endswith("ms") else max)(r[k] for r in runs) for k in runs[0]}
        print(f"| {client} | {best['p50_ms']:.2f} | {best['p99_ms']:.2f} | {best['rps32']:.0f} | {best['stream_rps32']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
