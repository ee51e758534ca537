"""The relay's HTTP/1.1 client: httptools' parser on asyncio protocols, with a keep-alive pool.

Written here rather than taken from a library because the relay needs little of a general client
and pays for all of it on every request: aiohttp's ClientSession was ~29 % of the gateway's CPU
per relayed request (py-spy under benchmarks/relay_overhead.py: cookie jar, tracing signals,
multidict headers, payload objects, a StreamReader per response). Of the other asyncio clients,
httpx costs more than aiohttp (docs/benchmarks.md) and aiosonic did no better than aiohttp in
benchmarks/relay_clients.py; the Rust clients (pyreqwest, rnet) were not tried: their I/O runs on
threads of their own, which on a gateway pinned to one core adds a hand-off per read.
This one does what the relay asks and no more: one write per request, the response's status once
its headers are parsed, its body as the bytes that arrived (Content-Length, chunked or until the
connection closes, llhttp deframes), idle connections reused LIFO below the engines' own
keep-alive, reading paused while a slow client leaves more than `HIGH_WATER` bytes unread.

Contract (what adapters/openai_http.py relies on):
- `request` raises `UpstreamConnectionError` when the engine cannot be reached (refused, DNS,
  connect timeout) and `UpstreamDisconnected` when a connection broke before the response's headers
  twice: a break on the first try is sent once more on a new connection, since a kept-alive one the
  engine had closed (llama-server closes after each stream) is indistinguishable from one it closes
  while we write.
- A body's bytes that arrived before the connection broke are handed over first; the break is
  raised by the next read.
- Cancelling `request` or a read, or `abort()`, closes the connection at once: the engine sees the
  request cancelled. Only a response read to its end and `release()`d goes back to the pool.
- `deadline` (the running loop's `time()`, or None for none) bounds `request` until the response's
  headers and each read: past it they raise `TimeoutError` (the request then closes its connection;
  the reader aborts the response). A timer is armed only while a call actually waits, so a read whose
  bytes are already there costs nothing: `asyncio.timeout` around every read of a stream was ~4 % of
  a relayed stream's CPU.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Mapping
from urllib.parse import urlsplit

import httptools

HIGH_WATER = 256 * 1024
"""Unread response bytes above which the connection stops reading (TCP then slows the engine)."""


class UpstreamConnectionError(Exception):
    """The engine could not be reached, or the connection broke."""


class UpstreamDisconnected(UpstreamConnectionError):
    """The connection broke after the request may have reached the engine."""


class _Connection(asyncio.Protocol):
    """One upstream connection; carries one request at a time."""

    __slots__ = ("_framed", "_keep_alive", "_paused", "_waiter", "chunks", "closed", "complete", "error",
                 "idle_since", "key", "parser", "size", "status", "transport")

    def __init__(self, key: tuple[str, str, int]) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.parser: httptools.HttpResponseParser | None = None
        self.status = 0
        self.chunks: list[bytes] = []
        self.size = 0
        self.complete = False
        self.closed = False
        self.error: UpstreamConnectionError | None = None
        self.idle_since = 0.0
        self._framed = False
        self._keep_alive = False
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.parser is None:  # bytes while idle: nothing asked for them
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._broke(UpstreamConnectionError(f"malformed HTTP response: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.parser is not None and not self.complete:
            if self.status and not self._framed:
                self.complete = True  # a body delimited by the connection's end
            else:
                self._broke(UpstreamConnectionError(
                    "server disconnected" if exc is None else f"connection lost: {exc}"))
        self._wake()

    # -- httptools callbacks --------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) in (14, 17) and name.lower() in (b"content-length", b"transfer-encoding"):
            self._framed = True

    def on_headers_complete(self) -> None:
        assert self.parser is not None
        self.status = self.parser.get_status_code()
        self._keep_alive = self.parser.should_keep_alive()  # llhttp's answer holds only until the body ends
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.size += len(body)
        if self.size > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()

    # -- used by the client and the response ----------------------------------------------------

    def start(self, data: bytes) -> None:
        """Send one request; the response's state starts afresh."""
        assert self.transport is not None
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.chunks = []
        self.size = 0
        self.complete = self._framed = self._keep_alive = False
        self.transport.write(data)

    async def wait(self, deadline: float | None = None) -> None:
        """Until the next callback (headers, body, end, break); TimeoutError once `deadline` passes."""
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = None if deadline is None else loop.call_at(deadline, _expire, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def take(self) -> bytes:
        data = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
        self.chunks = []
        self.size = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    def reusable(self) -> bool:
        return self.complete and self._keep_alive and not self.closed and self.error is None

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _broke(self, error: UpstreamConnectionError) -> None:
        if self.error is None:
            self.error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class HttptoolsResponse:
    """One response; see the module's contract."""

    __slots__ = ("_conn", "_pool", "status")

    def __init__(self, conn: _Connection, pool: HttptoolsClient) -> None:
        self._conn = conn
        self._pool = pool
        self.status = conn.status

    async def read(self, deadline: float | None = None) -> bytes:
        conn = self._conn
        while not conn.complete:
            if conn.error is not None:
                raise conn.error
            if conn._paused and conn.transport is not None:  # the whole body is wanted anyway
                conn._paused = False
                conn.transport.resume_reading()
            await conn.wait(deadline)
        return conn.take()

    async def read_chunk(self, deadline: float | None = None) -> bytes:
        conn = self._conn
        while True:
            if conn.chunks:
                return conn.take()
            if conn.complete:
                return b""
            if conn.error is not None:
                raise conn.error
            await conn.wait(deadline)

    def release(self) -> None:
        conn = self._conn
        if conn.reusable():
            self._pool._put(conn)
        else:
            conn.close()

    def abort(self) -> None:
        self._conn.close()


class HttptoolsClient:
    """Unlimited connections per upstream; idle ones kept `keepalive` seconds (below the engines' own
    5 s of llama-server and uvicorn, so the relay never writes onto a connection the engine is closing)."""

    def __init__(self, connect_timeout: float = 10.0, keepalive: float = 3.0) -> None:
        self._connect_timeout = connect_timeout
        self._keepalive = keepalive
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._urls: dict[str, tuple[tuple[str, str, int], str]] = {}
        self._ssl: ssl.SSLContext | None = None

    async def request(self, method: str, url: str, headers: Mapping[str, str], body: bytes | None,
                      deadline: float | None = None) -> HttptoolsResponse:
        key, target = self._split(url)
        data = _serialise(method, target, key, headers, body)
        idle = self._take_idle(key)
        conn = idle or await self._connect(key, deadline)
        try:
            return await self._exchange(conn, data, deadline)
        except UpstreamDisconnected as exc:
            if idle is None:
                conn.close()
                raise  # a fresh connection the engine closed: it failed (a crash), nothing stale to retry
            first = exc  # resent below, outside this handler, so it is not the next error's context
        except BaseException:
            conn.close()
            raise
        conn.close()
        try:
            conn = await self._connect(key, deadline)
        except UpstreamConnectionError:
            # the engine is gone since it took the request: that request killed it or it died under it,
            # which the first error says (an engine reset), not a refused connection
            raise UpstreamDisconnected(f"{first}; not resent: the engine no longer accepts connections") from None
        try:
            return await self._exchange(conn, data, deadline)
        except UpstreamDisconnected as again:
            conn.close()
            raise UpstreamDisconnected(f"{first}; resent: {again}") from None
        except BaseException:
            conn.close()
            raise

    async def _exchange(self, conn: _Connection, data: bytes, deadline: float | None) -> HttptoolsResponse:
        conn.start(data)
        while not conn.status:
            if conn.error is not None:
                raise UpstreamDisconnected(str(conn.error))
            if conn.closed:
                raise UpstreamDisconnected("server disconnected")
            await conn.wait(deadline)
        return HttptoolsResponse(conn, self)

    def _split(self, url: str) -> tuple[tuple[str, str, int], str]:
        known = self._urls.get(url)
        if known is not None:
            return known
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UpstreamConnectionError(f"unsupported URL {url!r}: http:// or https:// with a host")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        known = ((parts.scheme, parts.hostname, port), target)
        if len(self._urls) > 1024:
            self._urls.clear()
        self._urls[url] = known
        return known

    def _take_idle(self, key: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self._keepalive:
                return conn
            conn.close()
        return None

    def _put(self, conn: _Connection) -> None:
        conn.parser = None
        conn.idle_since = time.monotonic()
        idle = self._idle.setdefault(conn.key, [])
        if idle and (idle[0].closed or conn.idle_since - idle[0].idle_since >= self._keepalive):
            idle[:] = [c for c in idle if not c.closed and conn.idle_since - c.idle_since < self._keepalive]
        idle.append(conn)

    async def _connect(self, key: tuple[str, str, int], deadline: float | None) -> _Connection:
        scheme, host, port = key
        conn = _Connection(key)
        context = None
        if scheme == "https":
            context = self._ssl = self._ssl or ssl.create_default_context()
        loop = asyncio.get_running_loop()
        limit = loop.time() + self._connect_timeout
        bound = limit if deadline is None else min(limit, deadline)
        try:
            async with asyncio.timeout_at(bound):
                await loop.create_connection(
                    lambda: conn, host, port, ssl=context, server_hostname=host if context else None)
        except TimeoutError:
            conn.close()
            if bound < limit:
                raise  # the caller's deadline came first
            raise UpstreamConnectionError(f"cannot connect to {host}:{port}: timed out after {self._connect_timeout:g}s") from None
        except OSError as exc:  # refused, unreachable, DNS (socket.gaierror), TLS (ssl.SSLError)
            raise UpstreamConnectionError(f"cannot connect to {host}:{port}: {exc}") from exc
        return conn

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


def _serialise(method: str, target: str, key: tuple[str, str, int], headers: Mapping[str, str], body: bytes | None) -> bytes:
    scheme, host, port = key
    default = 443 if scheme == "https" else 80
    authority = (f"[{host}]" if ":" in host else host) + ("" if port == default else f":{port}")
    lines = [f"{method} {target} HTTP/1.1\r\n", f"Host: {authority}\r\n"]
    for name, value in headers.items():
        if "\n" in name or "\r" in name or "\n" in value or "\r" in value or ":" in name:
            raise ValueError(f"header {name!r} holds a line break or colon")
        if len(name) == 4 and name.lower() == "host":
            lines[1] = ""  # a configured Host replaces the URL's, as aiohttp did
        lines.append(f"{name}: {value}\r\n")
    if body is not None:
        lines.append(f"Content-Length: {len(body)}\r\n")
    lines.append("\r\n")
    head = "".join(lines).encode("utf-8")
    return head + body if body else head
