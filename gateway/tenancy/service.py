"""The tenancy service, where every side effect lives: authenticate a key, reserve its limits,
settle what a request used, buffer usage while the store is down, and spool it on shutdown.

Store faults: with `on_store_error: closed` (the default) a request that needs the store answers
503 store_unavailable (static config keys still authenticate); with `open` the last-known keys
authenticate and limits are not enforced. Usage that cannot be written is kept in memory and
written when the store answers again; what is still unwritten at shutdown goes to a spool file
(0600) beside the key store, replayed at the next start.

Every reserve and settle carries the request's id (made here), so the store applies each once and a
replay is harmless. A request holding a concurrency slot holds a lease that one background task
renews every LEASE_RENEW_S for all of this process's requests in flight; a settle stops renewing it
at once, even when the settle itself has to wait in the buffer (the buffered settle releases it when
written, else it expires), so a dead process's or a lost store's slots come back on their own.
Neither background task (renewing leases, writing buffered usage) ever stops on an error.

Cost per request (benchmarks/tenancy_overhead.py): one store round trip at most, the reserve.
- Key lookups are cached in this process while the store's push channel (`KeyStore.watch`: Redis
  pub/sub, PostgreSQL LISTEN/NOTIFY, the SQLite file's change counter) is live. Revocation bound: a
  revoke or rotation anywhere empties the cache of every gateway on the channel within about one
  round trip (SQLite: this process's own at once, another process's within WATCH_PING_S); a channel
  lost, or silent past WATCH_DEAD_S, empties it and nothing is cached until it is back; and no entry
  is used past KEY_CACHE_MAX_AGE_S whatever the channel says. A lookup that was in flight when the
  cache was emptied is not cached. Without `start()` (no watch) nothing is cached.
- Settles are written after the response by one writer task, every settle queued while a write is
  in flight going in the next one (a batch per round trip). A reserve of a key with a concurrency cap
  carries the ids of the requests of that key whose settle this process has queued and not yet
  written (`released`, at most RELEASED_MAX): the store ends their leases in the reserve's own step,
  so a client's next request finds its slot free here without waiting for that write (an id is named
  until a reserve that named it or its settle has been written); on another
  gateway it may find it held for that one write (a refusal, never an excess). The tokens those
  settles refund are still counted until they are written (a refusal at the edge, never an excess)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import orjson

from gateway.tenancy.keys import KeyRecord, UnreadableKey, hash_secret
from gateway.tenancy.limits import Decision, Limits, Reservation, budget_period
from gateway.tenancy.metrics import TenancyMetrics
from gateway.tenancy.store import LEASE_RENEW_S, KeyStore, Settlement, StoreUnavailable, UsageDelta
from gateway.tenancy.ticket import Ticket

log = logging.getLogger("enginegate.tenancy")
HAS_KEYS_TTL_S = 1.0
FLUSH_INTERVAL_S = 1.0
KNOWN_KEYS_MAX = 10_000
RELEASED_MAX = 256
"""The most ended requests' ids one reserve releases (more: the rest are released by their settles)."""
KEY_CACHE_MAX_AGE_S = 5.0
"""The oldest cached key lookup used, whatever the push channel says (the bound if a push is lost unseen)."""


class Refused(Exception):
    def __init__(self, decision: Decision) -> None:
        super().__init__(decision.refused)
        self.decision = decision


class KeyRevoked(Exception):
    """The reserve found the key revoked or rotated since it was authenticated (a 401, like a lookup's None)."""


class Tenancy:
    def __init__(self, store: KeyStore, static: Iterable[tuple[str, KeyRecord]] = (), *, spool: Path | None = None,
                 on_store_error: Literal["closed", "open"] = "closed", metrics: TenancyMetrics | None = None,
                 lease_renew_s: float = LEASE_RENEW_S) -> None:
        self.store = store
        self.static = {hash_secret(secret): record for secret, record in static}
        self.static_names = {r.name: r for r in self.static.values()}
        self.spool = spool
        self.fail_open = on_store_error == "open"
        self.metrics = metrics
        self._known: dict[str, KeyRecord] = {}  # for on_store_error: open
        self._has_keys: tuple[float, bool] = (-HAS_KEYS_TTL_S, True)  # closed until the store has answered
        self._pending: list[Settlement] = []
        self._flusher: asyncio.Task[None] | None = None
        self._leases: dict[str, str] = {}  # request id -> key name: the leases of this process's requests in flight
        self._renewer: asyncio.Task[None] | None = None
        self.lease_renew_s = lease_renew_s
        self._replayed = False
        self._cache: dict[str, tuple[float, KeyRecord]] = {}  # secret hash -> (looked up at, record)
        self._cache_live = False  # the store's push channel is live: lookups may be cached
        self._cache_generation = 0  # every change event: a lookup begun before it is not cached
        self._watcher: asyncio.Task[None] | None = None
        self._releasing: dict[str, dict[str, None]] = {}  # key name -> ids whose releasing settle is not yet written
        self._round: asyncio.Future[None] | None = None  # the write round in flight: done when it ends
        self._next_round: asyncio.Future[None] | None = None  # the round the settles queued now go in
        self._failing = False  # the last write failed: the writer waits FLUSH_INTERVAL_S between tries

    # -- authentication ------------------------------------------------------------------------
    async def required(self) -> bool:
        """Keys are on (a key in the config file, or the store's record that a key was ever made, until
        `disable_auth`): every protected route needs one. The store is asked at most once a second."""
        if self.static:
            return True
        at, value = self._has_keys
        now = time.monotonic()
        if now - at < HAS_KEYS_TTL_S:
            return value
        self._has_keys = (now, value)  # one refresh at a time: concurrent requests use the last answer
        try:
            value = await self.store.auth_enabled()
        except StoreUnavailable as exc:
            log.warning("%s: keys are required until it answers", exc)
            value = True
        self._has_keys = (time.monotonic(), value)
        return value

    async def disable_auth(self) -> None:
        """Turn "keys are on" off in the store (raises KeysActive while a key is active); this process
        sees it at once. Keys in the config file still authenticate and keep every route closed."""
        await self.store.disable_auth()
        self._has_keys = (time.monotonic(), False)

    async def authenticate(self, token: bytes) -> KeyRecord | None:
        """The active, unexpired key with this secret, or None. Raises StoreUnavailable (fail closed), and
        UnreadableKey for a stored key with policy fields this gateway does not know (a restriction it
        cannot enforce: fail closed, on every route that reads the key)."""
        digest = hash_secret(token)
        record = self.static.get(digest)
        if record is None:
            record = self._cached(digest)
        if record is None:
            generation, at = self._cache_generation, time.monotonic()
            try:
                record = await self.store.lookup(digest)
            except StoreUnavailable:
                if not self.fail_open or digest not in self._known:
                    raise
                record = self._known[digest]
            else:
                if record is not None and self._cache_live and generation == self._cache_generation:
                    if len(self._cache) >= KNOWN_KEYS_MAX:
                        self._cache.clear()
                    self._cache[digest] = (at, record)
            if record is not None and len(self._known) < KNOWN_KEYS_MAX:
                self._known[digest] = record
            elif record is None:
                self._known.pop(digest, None)
        if record is None or record.revoked_at is not None or record.expired(time.time()):
            return None
        if record.unknown:
            raise UnreadableKey(f"the stored key {record.name!r} has policy fields this gateway cannot enforce "
                                f"({', '.join(sorted(record.unknown))}): written by a newer gateway? It is refused "
                                "here until this gateway is upgraded")
        return record

    def _cached(self, digest: str) -> KeyRecord | None:
        hit = self._cache.get(digest)
        if hit is None:
            return None
        if time.monotonic() - hit[0] >= KEY_CACHE_MAX_AGE_S:
            del self._cache[digest]
            return None
        return hit[1]

    def _keys_changed(self, live: bool) -> None:
        """The store's watch: a key changed somewhere or the channel came back (True), or it is lost (False)."""
        self._cache.clear()
        self._cache_generation += 1
        self._cache_live = live

    async def _watch(self) -> None:
        while True:  # a watch never raises for a store fault; anything else is a bug, logged, and retried
            try:
                await self.store.watch(self._keys_changed)
                return
            except Exception:
                log.exception("watching key changes failed: key lookups are not cached until it is back")
            finally:
                self._keys_changed(False)
            await asyncio.sleep(FLUSH_INTERVAL_S)

    # -- limits --------------------------------------------------------------------------------
    async def reserve(self, record: KeyRecord, model: str, charge: Reservation) -> Ticket:
        """Admit one request of this key (raises Refused for a 429, KeyRevoked for a 401, StoreUnavailable when
        failing closed). A stored key's reserve checks, in the same store step, that it is still active under
        its secret."""
        policy = record.policy
        if not policy.limited:
            return Ticket(record.name, model)
        limits = Limits.of(policy, time.time())
        cost = charge.tokens if limits.tpm or limits.budget else 0  # prompt + max_tokens x n; the settle refunds
        request_id = uuid.uuid4().hex  # the gateway's own: a client-sent id could replay another request's charge
        releasing = self._releasing.get(record.name) if limits.concurrency else None
        released = tuple(itertools.islice(releasing, RELEASED_MAX)) if releasing else ()
        try:
            decision = await self.store.reserve(record.name, limits, cost, request_id,
                                                None if record.static else record.secret_hash, released)
        except StoreUnavailable as exc:
            if not self.fail_open:
                raise
            log.warning("%s: admitting %s without limits (on_store_error: open)", exc, record.name)
            return Ticket(record.name, model)
        if released and decision.refused != "revoked":  # their leases are gone: no later reserve names them again
            self._forget_releases(record.name, released)
        if decision.refused == "revoked":
            self._cache.pop(record.secret_hash, None)
            self._known.pop(record.secret_hash, None)
            raise KeyRevoked(record.name)
        if not decision.admitted:
            if self.metrics is not None:
                self.metrics.rejected(record.name, model, decision.refused or "")
            await self._write([Settlement(request_id, record.name, None, 0, False, _usage(record.name, model, rejected=1))])
            raise Refused(decision)
        if limits.concurrency:
            self._leases[request_id] = record.name
            if self._renewer is None or self._renewer.done():
                self._renewer = asyncio.create_task(self._renew_loop())
        return Ticket(record.name, model, limits, decision, charged=cost, estimate=charge.prompt, request_id=request_id)

    def _forget_releases(self, name: str, request_ids: Iterable[str]) -> None:
        releasing = self._releasing.get(name)
        if releasing is None:
            return
        for request_id in request_ids:
            releasing.pop(request_id, None)
        if not releasing:
            del self._releasing[name]

    async def _renew_loop(self) -> None:
        """Renew every lease held here, in one store call per round; runs until close()."""
        while True:
            await asyncio.sleep(self.lease_renew_s)
            leases = [(name, request_id) for request_id, name in self._leases.items()]
            if not leases:
                continue
            try:
                await self.store.renew(leases)
            except Exception as exc:  # never stop renewing: a lease missed once may still be renewed in time
                log.warning("renewing %d concurrency lease(s) failed (%s: %s); trying again in %gs",
                            len(leases), type(exc).__name__, exc, self.lease_renew_s)

    async def settle(self, ticket: Ticket, failed: bool, engine_s: float) -> None:
        if ticket.settled:
            return
        ticket.settled = True
        self._leases.pop(ticket.request_id, None)  # its lease is released by the settle, or expires
        prompt = ticket.prompt_used
        completion = ticket.completion_tokens or ticket.streamed_events
        usage = _usage(ticket.name, ticket.model, requests=1, prompt_tokens=prompt, completion_tokens=completion,
                       errors=int(failed or ticket.failed), engine_ms=round(engine_s * 1000))
        if self.metrics is not None:
            self.metrics.settled(usage)
        await self._write([Settlement(ticket.request_id or uuid.uuid4().hex, ticket.name, ticket.limits if ticket.decision else None, ticket.token_delta(),
                                      ticket.holds_slot, usage)])

    # -- writing usage -------------------------------------------------------------------------
    async def _write(self, settlements: list[Settlement]) -> None:
        """Queue them (in order, after what is already waiting) for the writer task and wait for the write
        round that holds them: written, or kept in the buffer when the store failed. Never raises."""
        self._pending.extend(settlements)
        for s in settlements:
            if s.release:
                self._releasing.setdefault(s.name, {})[s.request_id] = None
        if self._next_round is None:
            self._next_round = asyncio.get_running_loop().create_future()
        round_done = self._next_round
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_loop())
        await asyncio.shield(round_done)

    async def _flush_loop(self) -> None:
        """One store call per round for everything queued, until nothing is; after a failed round it waits
        FLUSH_INTERVAL_S. Never stops on a store's error, whatever it is (flush() turns each into False)."""
        try:
            while self._pending:
                await self.flush()
                if self._failing:
                    await asyncio.sleep(FLUSH_INTERVAL_S)
        finally:
            for fut in (self._round, self._next_round):  # nobody waits past the writer (close() cancels it)
                if fut is not None and not fut.done():
                    fut.set_result(None)
            self._round = self._next_round = None

    async def flush(self) -> bool:
        """Write what is buffered, in one store call; True when nothing is left."""
        batch = self._pending[:]
        self._round, self._next_round = self._next_round, None
        try:
            if batch:
                await self._write_batch(batch)
        finally:
            if self._round is not None and not self._round.done():
                self._round.set_result(None)
            self._round = None
        return not self._pending

    async def _write_batch(self, batch: list[Settlement]) -> None:
        try:
            await self.store.settle(batch)  # safe to repeat: the store applies each request id once
        except Exception as exc:  # a store bug must not lose usage either (close() spools what is left)
            if not self._failing:
                if isinstance(exc, StoreUnavailable):
                    log.warning("%s: usage kept in memory until it answers", exc)
                else:
                    log.exception("writing %d usage record(s) failed: kept in memory, tried again every %gs",
                                  len(batch), FLUSH_INTERVAL_S)
            self._failing = True
            return
        del self._pending[:len(batch)]
        for s in batch:
            if s.release:
                self._forget_releases(s.name, (s.request_id,))
        if self._failing:
            self._failing = False
            log.info("wrote %d buffered usage record(s) to the key store", len(batch))

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def close(self) -> None:
        """At shutdown: write the buffer, else spool it to a file; nothing is lost."""
        for task in (self._flusher, self._renewer, self._watcher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if not await self.flush() and self.spool is not None:
            self._spool_out(self._pending)
            self._pending.clear()
        await self.store.close()

    def _spool_out(self, settlements: list[Settlement]) -> None:
        assert self.spool is not None
        if not self.spool.parent.exists():
            self.spool.parent.mkdir(parents=True, mode=0o700)
        fd = os.open(self.spool, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "ab") as out:
            for s in settlements:
                out.write(orjson.dumps(s.to_json()) + b"\n")
        log.warning("key store unreachable at shutdown: %d usage record(s) spooled to %s", len(settlements), self.spool)

    async def _replay_spool(self) -> None:
        if self._replayed:
            return
        self._replayed = True
        if self.spool is None or not self.spool.exists():
            return
        claimed = self.spool.with_suffix(f".{os.getpid()}")
        try:
            self.spool.rename(claimed)  # one process replays it
        except OSError:
            return
        lines = claimed.read_bytes().splitlines()
        await self._write([Settlement.from_json(orjson.loads(line)) for line in lines if line.strip()])
        claimed.unlink()
        log.info("replayed %d spooled usage record(s)", len(lines))

    async def start(self) -> None:
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch())
        await self.required()
        await self._replay_spool()


def _usage(name: str, model: str, **counts: int) -> UsageDelta:
    return UsageDelta(name, model, budget_period("day", time.time())[0], **counts)  # the UTC day
