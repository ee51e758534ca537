"""The relay to an OpenAI-compatible upstream: the one module in the gateway that holds an HTTP client.

Non-streaming responses pass through as the upstream's bytes. SSE streams pass through event by
event: each upstream event becomes one `StreamEvent` whose `data` is the upstream payload,
untouched; the relay parses each payload only to observe first content, usage and
finish_reason. When the client did not ask for `stream_options.include_usage` the relay asks
the engine anyway and turns that usage-only chunk into an observe-only event (empty `data`).

Engine quirks become OpenAI behaviour here: every error shape (nested, flat, bare string,
FastAPI `detail`, empty body) becomes `{"error": {...}}`; `\\r\\n` separators, a trailing space
after the payload and comment/ping lines are handled; a stream that dies, stalls or sends
garbage ends with one `{"error": ...}` event, never a hang. Closing the event iterator (client
gone) aborts the upstream connection at once, which is how engines notice a cancelled request.

The HTTP client sits behind `HttpClient`: adapters/http_client.py's (httptools on asyncio protocols)
by default, which won the measurement against aiohttp (kept here), httpx and others
(benchmarks/relay_clients.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import orjson

from adapters.base import Completion, EngineError, RequestContext, StreamEvent
from adapters.chat_shape import ToolCallDeltas
from adapters.http_client import HttptoolsClient, UpstreamConnectionError, UpstreamDisconnected
from adapters.observe import extract_usage, mend_chat_body, observe, split_usage
from adapters.sse import SSEParser
from adapters.upstream_errors import error_event, error_exception, normalise_error

__all__ = [
    "AiohttpClient",
    "HttpClient",
    "HttptoolsClient",
    "Relay",
    "SSEParser",
    "Timeouts",
    "Upstream",
    "UpstreamConnectionError",
    "UpstreamDisconnected",
    "UpstreamResponse",
    "error_exception",
    "forward_headers",
    "normalise_error",
]

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "trailers", "transfer-encoding", "upgrade",
})
CHAT_PATH = "/chat/completions"
"""Chat results are mended where an engine deviates from OpenAI's shape (adapters/chat_shape.py)."""
# Never forwarded either: framing the relay sets itself, and the client's credentials for the gateway.
_NOT_FORWARDED = HOP_BY_HOP | {"host", "content-length", "content-type", "accept", "accept-encoding", "authorization", "x-api-key"}


def forward_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers safe to pass to the other side: hop-by-hop ones (and those `Connection` names) dropped."""
    named = {
        token.strip().lower()
        for key, value in headers.items() if key.lower() == "connection"
        for token in value.split(",")
    }
    return {k: v for k, v in headers.items() if k.lower() not in _NOT_FORWARDED and k.lower() not in named}


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect: float = 10.0
    first_byte: float = 600.0
    """Until the response headers, and then until the first stream event (queueing + prefill)."""
    idle: float = 120.0
    """Between two reads of a stream."""
    total: float = 1800.0
    """A whole non-streaming response."""


@dataclass(frozen=True, slots=True)
class Upstream:
    base_url: str
    api_key: str | None = None
    model: str | None = None
    """Replaces the body's `model` (the engine's own id for the served model), if set."""
    headers: Mapping[str, str] = field(default_factory=dict)
    ask_usage: bool = True
    """The engine honours stream_options.include_usage, so the relay may ask for it."""


class UpstreamResponse(Protocol):
    """`deadline` is the running loop's `time()` past which a read raises TimeoutError (None: no limit)."""

    status: int

    async def read(self, deadline: float | None = None) -> bytes: ...

    async def read_chunk(self, deadline: float | None = None) -> bytes:
        """The bytes available now (waits for some); b"" at the end of the body."""
        ...

    def release(self) -> None:
        """The body was read to its end: the connection may be reused."""
        ...

    def abort(self) -> None:
        """Close the connection now, so the engine sees the request cancelled."""
        ...


class HttpClient(Protocol):
    async def request(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None, deadline: float | None = None
    ) -> UpstreamResponse:
        """TimeoutError when the response's headers have not come by `deadline` (the loop's time)."""
        ...

    async def aclose(self) -> None: ...


class _AiohttpResponse:
    __slots__ = ("_broken", "_resp", "status")

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self._broken: UpstreamConnectionError | None = None

    async def read(self, deadline: float | None = None) -> bytes:
        try:
            async with asyncio.timeout_at(deadline):
                return await self._resp.read()
        except aiohttp.ClientError as exc:
            raise UpstreamConnectionError(str(exc) or type(exc).__name__) from exc

    async def read_chunk(self, deadline: float | None = None) -> bytes:
        if self._broken is not None:
            raise self._broken
        try:
            async with asyncio.timeout_at(deadline):
                return await self._resp.content.readany()
        except aiohttp.ClientError as exc:
            broken = UpstreamConnectionError(str(exc) or type(exc).__name__)
            left = _left_over(self._resp.content)
            if not left:
                raise broken from exc
            self._broken = broken  # what the engine sent before it died first, then the break
            return left

    def release(self) -> None:
        self._resp.release()

    def abort(self) -> None:
        self._resp.close()


def _left_over(content: aiohttp.StreamReader) -> bytes:
    """Bytes that arrived before the connection broke. aiohttp raises the break before handing
    them over (readany checks for an exception first), which would lose the last tokens an
    engine sent before it died."""
    read = getattr(content, "_read_nowait", None)
    if read is None or not getattr(content, "_buffer", None):
        return b""
    try:
        return bytes(read(-1))
    except Exception:  # noqa: BLE001 - aiohttp internals: nothing to recover then
        return b""


class AiohttpClient:
    """One aiohttp session (created on first use, in the running loop), unlimited connections.

    `keepalive` stays below the engines' own idle keep-alive (5 s for llama-server and uvicorn),
    so the relay never writes a request onto a connection the engine is closing.
    """

    def __init__(self, connect_timeout: float = 10.0, keepalive: float = 3.0) -> None:
        self._connect_timeout = connect_timeout
        self._keepalive = keepalive
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=self._keepalive, use_dns_cache=True)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None, connect=self._connect_timeout),
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
            )
        return self._session

    async def request(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None, deadline: float | None = None
    ) -> UpstreamResponse:
        async with asyncio.timeout_at(deadline):
            return await self._request(method, url, headers, body)

    async def _request(self, method: str, url: str, headers: Mapping[str, str], body: bytes | None) -> UpstreamResponse:
        session = self._get_session()
        try:
            try:
                resp = await session.request(method, url, headers=headers, data=body)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                if isinstance(exc, aiohttp.ClientConnectorError):
                    raise
                # A kept-alive connection the engine had closed (llama-server closes after each
                # stream while advertising keep-alive): nothing reached it, so send once more.
                # If that fails too, the engine died with the request: report a lost connection.
                try:
                    resp = await session.request(method, url, headers=headers, data=body)
                except aiohttp.ClientError as again:
                    raise UpstreamDisconnected(f"{exc}; resent: {again}") from again
        except aiohttp.ClientError as exc:
            raise UpstreamConnectionError(str(exc) or type(exc).__name__) from exc
        return _AiohttpResponse(resp)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


# -- the relay ------------------------------------------------------------------------------


class Relay:
    """Forward OpenAI requests to an upstream; one per adapter, closed with `aclose()`."""

    def __init__(self, engine: str = "engine", timeouts: Timeouts = Timeouts(), client: HttpClient | None = None) -> None:
        self.engine = engine
        self.timeouts = timeouts
        self.client: HttpClient = client or HttptoolsClient(connect_timeout=timeouts.connect)

    async def aclose(self) -> None:
        await self.client.aclose()

    def _headers(self, upstream: Upstream, ctx: RequestContext | None, stream: bool) -> dict[str, str]:
        headers: dict[str, str] = {}
        if ctx is not None:
            extra = ctx.extra.get("headers")
            if isinstance(extra, Mapping):
                headers.update(forward_headers(extra))
            headers["X-Request-Id"] = ctx.request_id
        headers.update(upstream.headers)
        headers["Content-Type"] = "application/json"
        headers["Accept"] = "text/event-stream" if stream else "application/json"
        if upstream.api_key:
            headers["Authorization"] = f"Bearer {upstream.api_key}"
        return headers

    async def _send(self, method: str, upstream: Upstream, path: str, body: bytes | None,
                    headers: Mapping[str, str], timeout: float, deadline: float | None = None) -> UpstreamResponse:
        """The response's headers within `timeout` seconds (and by `deadline`, the whole call's, if sooner)."""
        url = upstream.base_url.rstrip("/") + path
        limit = asyncio.get_running_loop().time() + timeout
        try:
            return await self.client.request(method, url, headers, body, limit if deadline is None else min(limit, deadline))
        except TimeoutError:
            if deadline is not None and deadline < limit:
                raise  # the caller's deadline: it says what ran out
            raise EngineError(f"{self.engine} sent no response within {timeout:.0f}s", 504, "upstream_timeout") from None
        except UpstreamDisconnected as exc:
            raise EngineError(f"{self.engine} connection lost before a response: {exc}", 502, "engine_reset") from exc
        except UpstreamConnectionError as exc:
            raise EngineError(f"{self.engine} is unreachable: {exc}", 503, "engine_unreachable") from exc

    async def _fail(self, resp: UpstreamResponse) -> Exception:
        try:
            raw = await resp.read(asyncio.get_running_loop().time() + self.timeouts.idle)
            resp.release()
        except (TimeoutError, UpstreamConnectionError):
            resp.abort()
            raw = b""
        return error_exception(resp.status, raw, self.engine)

    def _body(self, upstream: Upstream, body: dict[str, Any]) -> dict[str, Any]:
        if upstream.model is not None and body.get("model") != upstream.model:
            return {**body, "model": upstream.model}
        return body

    async def get(self, upstream: Upstream, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        """A small GET (model list, health, metrics). Raises UpstreamConnectionError / TimeoutError."""
        headers = {"Authorization": f"Bearer {upstream.api_key}"} if upstream.api_key else {}
        async with asyncio.timeout(timeout):
            resp = await self.client.request("GET", upstream.base_url.rstrip("/") + path, headers, None)
            try:
                raw = await resp.read()
            except BaseException:
                resp.abort()
                raise
            resp.release()
            return resp.status, raw

    async def complete(self, upstream: Upstream, path: str, body: dict[str, Any], ctx: RequestContext) -> Completion:
        """A non-streaming request: the upstream's body passes through as bytes."""
        payload = orjson.dumps(self._body(upstream, body))
        headers = self._headers(upstream, ctx, stream=False)
        deadline = asyncio.get_running_loop().time() + self.timeouts.total
        try:
            resp = await self._send("POST", upstream, path, payload, headers, self.timeouts.first_byte, deadline)
            if resp.status != 200:
                raise await self._fail(resp)
            try:
                raw = await resp.read(deadline)
            except BaseException:
                resp.abort()
                raise
            resp.release()
        except TimeoutError:
            raise EngineError(f"{self.engine} did not finish within {self.timeouts.total:.0f}s", 504, "upstream_timeout") from None
        except UpstreamConnectionError as exc:
            raise EngineError(f"{self.engine} connection lost: {exc}", 502, "engine_disconnected") from exc
        if path.endswith(CHAT_PATH):
            raw, usage = mend_chat_body(raw)
            return Completion(body=raw, usage=usage)
        return Completion(body=raw, usage=extract_usage(raw))

    async def stream(self, upstream: Upstream, path: str, body: dict[str, Any], ctx: RequestContext) -> AsyncIterator[StreamEvent]:
        """Open a stream; errors before the first event raise, later ones end it with an error event."""
        body = self._body(upstream, body)
        options = body.get("stream_options")
        client_usage = ctx.include_usage or (isinstance(options, dict) and bool(options.get("include_usage")))
        drop_usage = False
        if upstream.ask_usage and not client_usage:
            body = {**body, "stream_options": {**(options if isinstance(options, dict) else {}), "include_usage": True}}
            drop_usage = True
        headers = self._headers(upstream, ctx, stream=True)
        resp = await self._send("POST", upstream, path, orjson.dumps(body), headers, self.timeouts.first_byte)
        if resp.status != 200:
            raise await self._fail(resp)
        return self._events(resp, drop_usage, ToolCallDeltas() if path.endswith(CHAT_PATH) else None)

    async def _events(self, resp: UpstreamResponse, drop_usage: bool,
                      tool_deltas: ToolCallDeltas | None = None) -> AsyncIterator[StreamEvent]:
        parser = SSEParser()
        timeout = self.timeouts.first_byte
        time = asyncio.get_running_loop().time
        finished = False  # [DONE] seen, or a finish_reason (engines that omit [DONE])
        clean = False
        try:
            while True:
                try:
                    chunk = await resp.read_chunk(time() + timeout)
                except TimeoutError:
                    yield error_event(f"{self.engine} sent nothing for {timeout:.0f}s; stream abandoned", "upstream_timeout", "timeout_error")
                    return
                except UpstreamConnectionError as exc:
                    yield error_event(f"{self.engine} connection lost mid-stream: {exc}", "engine_disconnected")
                    return
                payloads = parser.feed(chunk) if chunk else parser.close()
                events: list[StreamEvent] = []
                end = False
                for payload in payloads:
                    if payload == b"[DONE]":
                        clean = end = True
                        break
                    event = observe(payload, drop_usage, tool_deltas)
                    if event.usage is not None and event.data:
                        events.extend(split_usage(event, drop_usage))
                    else:
                        events.append(event)
                    if event.is_error:
                        end = True
                        break
                    if event.finish_reason is not None:
                        finished = True
                for event in events[:-1]:
                    event.more = True  # one read, one write to the client
                for event in events:
                    yield event
                if end:
                    return
                if not chunk:
                    if finished:
                        clean = True
                    else:
                        yield error_event(f"{self.engine} closed the stream before it finished", "engine_disconnected")
                    return
                timeout = self.timeouts.idle
        finally:
            if clean:
                resp.release()
            else:
                resp.abort()

    async def forward(self, upstream: Upstream, path: str, body: dict[str, Any], ctx: RequestContext) -> Completion | AsyncIterator[StreamEvent]:
        if body.get("stream"):
            return await self.stream(upstream, path, body, ctx)
        return await self.complete(upstream, path, body, ctx)
