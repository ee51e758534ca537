"""One asyncpg pool per gateway process, shared by every store in the database.

Bounds: every operation (getting a connection, connecting when the pool has none, the caller's
statements and giving the connection back) ends within `timeout_s`, the gateway's
`tenancy.store_timeout_seconds`; past it, or on any connection failure or server error, the caller
gets `DatabaseUnavailable`, never a hang. The server also bounds each statement (`statement_timeout`)
and a transaction left idle (`idle_in_transaction_session_timeout`), so a gateway that vanished
mid-transaction never holds a lock for long.

Outages: the pool is made on first use (`open()` may be called again at any time) and connects
lazily; connections the server closed are replaced on the next use, so the gateway recovers by
itself when the database returns. `run()` retries once when the connection died under it (a pooled
connection the server dropped while idle).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg

T = TypeVar("T")
POOL_MAX_SIZE = 10
SECRET_PARAMS = frozenset({"password", "sslpassword"})
TRANSIENT_SQLSTATES = ("08", "57P01", "57P02", "57P03", "53300")
"""Connection exceptions, the server shutting down or starting up, too many connections: waiting fixes them."""
SERVER_GONE = ("57P01", "57P02")
"""The server ended the session (admin or crash shutdown): the connection is dead."""


class DatabaseUnavailable(Exception):
    """The database cannot be used now: unreachable, too slow, or it refused the operation. The message
    names the database (never its password)."""

    def __init__(self, message: str, transient: bool = True, connection_lost: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.transient = transient
        """Waiting may fix it (unreachable, timed out, shutting down); False: the server answered with an
        error that waiting will not change (wrong password, no such database, a failed statement)."""
        self.connection_lost = connection_lost
        """The connection died under the operation (what `run()` retries once)."""


def redact(url: str) -> str:
    """The URL without its password (in the user part or a `password=` parameter)."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, hosts = netloc.rsplit("@", 1)
        netloc = f"{userinfo.split(':', 1)[0]}@{hosts}"
    query = urlencode([(k, "***" if k.lower() in SECRET_PARAMS else v)
                       for k, v in parse_qsl(parts.query, keep_blank_values=True)])
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, asyncpg.ClientConfigurationError):  # the URL or its options are wrong
        return False
    if isinstance(exc, asyncpg.PostgresError):
        return str(getattr(exc, "sqlstate", "") or "").startswith(TRANSIENT_SQLSTATES)
    return isinstance(exc, (OSError, TimeoutError, asyncpg.InterfaceError))


def _closed(conn: asyncpg.Connection) -> bool:
    try:
        return conn.is_closed()
    except asyncpg.InterfaceError:  # the pool took it back when it died
        return True


def _terminate(conn: asyncpg.Connection) -> None:
    try:
        conn.terminate()
    except asyncpg.InterfaceError:
        pass


class Database:
    def __init__(self, url: str, timeout_s: float, max_size: int = POOL_MAX_SIZE) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.max_size = max_size
        self._pool: asyncpg.Pool | None = None
        self._pool_lock = asyncio.Lock()
        self._closed = False

    def describe(self) -> str:
        return f"{redact(self.url)} (PostgreSQL)"

    async def open(self) -> None:
        """Make the pool if there is none, and prove the database answers (raises DatabaseUnavailable)."""
        async with self.connection() as conn:
            await conn.execute("SELECT 1")

    async def close(self) -> None:
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                await asyncio.wait_for(pool.close(), self.timeout_s)
            except (Exception, asyncio.TimeoutError):
                pool.terminate()

    async def _get_pool(self) -> asyncpg.Pool:
        if self._pool is not None:
            return self._pool
        async with self._pool_lock:
            if self._pool is None:
                if self._closed:
                    raise DatabaseUnavailable(f"the database {redact(self.url)} is closed (the gateway is stopping)")
                ms = str(int(self.timeout_s * 1000))
                idle_ms = str(int(max(10.0, 5 * self.timeout_s) * 1000))
                pool = asyncpg.create_pool(
                    self.url, min_size=0, max_size=self.max_size, timeout=self.timeout_s,
                    command_timeout=self.timeout_s,
                    server_settings={"application_name": "enginegate", "statement_timeout": ms,
                                     "idle_in_transaction_session_timeout": idle_ms})
                self._pool = await pool  # min_size=0: connects nothing yet
        return self._pool

    def _failure(self, exc: BaseException, limit: float, conn: asyncpg.Connection | None) -> DatabaseUnavailable:
        where = redact(self.url)
        lost = conn is not None and (_closed(conn) or isinstance(exc, (asyncpg.PostgresConnectionError,
                                                                     asyncpg.InternalClientError))
                                     or str(getattr(exc, "sqlstate", "") or "") in SERVER_GONE)
        if isinstance(exc, TimeoutError):
            return DatabaseUnavailable(f"the database {where} did not answer within {limit:g} s "
                                       "(tenancy.store_timeout_seconds)", connection_lost=False)
        detail = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
        return DatabaseUnavailable(f"the database {where} cannot be used ({detail})",
                                   transient=_transient(exc) or lost, connection_lost=lost)

    @asynccontextmanager
    async def connection(self, timeout_s: float | None = None) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection for one operation; everything in the block is bounded by the timeout."""
        limit = timeout_s if timeout_s is not None else self.timeout_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        conn: asyncpg.Connection | None = None
        pool: asyncpg.Pool | None = None
        try:
            async with asyncio.timeout_at(deadline):
                try:
                    pool = await self._get_pool()
                except ValueError as exc:  # a URL asyncpg cannot parse (asyncpg.ClientConfigurationError)
                    raise DatabaseUnavailable(f"the database URL {redact(self.url)} is not usable ({exc})",
                                              transient=False) from exc
                conn = await pool.acquire()
                yield conn
        except DatabaseUnavailable:
            raise
        except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError,
                asyncpg.InternalClientError) as exc:
            failure = self._failure(exc, limit, conn)
            if conn is not None and isinstance(exc, (TimeoutError, OSError, asyncpg.InterfaceError,
                                                     asyncpg.PostgresConnectionError, asyncpg.InternalClientError)):
                _terminate(conn)  # mid-statement or dead: never given back to be reused
            if failure.connection_lost and pool is not None:
                # The server dropped it (restarted, failed over): the pool's other idle connections are
                # as dead, some still looking alive (asyncpg sees the server's goodbye only on their next
                # use). Replace every one on its next acquire rather than fail one request per connection.
                await pool.expire_connections()
            raise failure from exc
        finally:
            if conn is not None and pool is not None:
                try:  # resets the session; bounded, and a connection that cannot be reset is dropped
                    await pool.release(conn, timeout=max(0.05, deadline - loop.time()))
                except (Exception, asyncio.TimeoutError):
                    pass

    @asynccontextmanager
    async def transaction(self, timeout_s: float | None = None) -> AsyncIterator[asyncpg.Connection]:
        """A connection inside one transaction: committed when the block ends, rolled back when it raises."""
        async with self.connection(timeout_s) as conn:
            async with conn.transaction():
                yield conn

    async def run(self, work: Callable[[asyncpg.Connection], Awaitable[T]], transaction: bool = False,
                  timeout_s: float | None = None) -> T:
        """`work(conn)` on a pooled connection (in a transaction if asked); when the connection died under
        it, once more on another, within the same time bound. `work` must be safe to run twice."""
        limit = timeout_s if timeout_s is not None else self.timeout_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        enter = self.transaction if transaction else self.connection
        for attempt in (1, 2):
            try:
                async with enter(max(0.0, deadline - loop.time()) if attempt == 2 else limit) as conn:
                    return await work(conn)
            except DatabaseUnavailable as exc:
                if attempt == 2 or not exc.connection_lost or loop.time() >= deadline:
                    raise
        raise AssertionError("unreachable")
