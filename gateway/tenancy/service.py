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

Cost per request (benchmarks/tenancy_overhead.py): one store round trip at most, the reserve; none for a busy
key admitted from its allotment (allotment.py: capacity the store charged to this process ahead of need, asked
for in the background, one grant in flight per key; used only while the push channel is live, like the lookup
cache, and dropped with it). Such a request's concurrency slot is a lease kept from the key's last request here:
a lease whose request ended stays LEASE_HOLD_S for the next one (renewed as a running one's), then is released
with the next settles; none is kept past LEASE_REUSE_S from its reserve. The settle that ends a lease carries the
lease's id (the store ends leases by it), every other settle its request's own.
- Key lookups are cached in this process while the store's push channel (`KeyStore.watch`: Redis
  pub/sub, PostgreSQL LISTEN/NOTIFY, the SQLite file's change counter) is live. Revocation bound: a
  revoke or rotation anywhere empties the cache of every gateway on the channel within about one
  round trip (SQLite: this process's own at once, another process's within WATCH_PING_S); a channel
  lost, or silent past WATCH_DEAD_S, empties it and nothing is cached until it is back; and no entry
  is used past KEY_CACHE_MAX_AGE_S whatever the channel says. A lookup that was in flight when the
  cache was emptied is not cached. Without `start()` (no watch) nothing is cached.
- Settles are written after the response by one writer task, every settle queued while a write is
  in flight (or in the WRITE_GAP_S after a round of several) going in the next one (a batch per round, those of one key and
  model merged into one: batching.py). A reserve of a key with a concurrency cap
  carries the ids of the requests of that key whose settle this process has queued and not yet
  written (`released`, at most RELEASED_MAX): the store ends their leases in the reserve's own step,
  so a client's next request finds its slot free here without waiting for that write (an id is named
  until a reserve that named it or its settle has been written); on another
  gateway it may find it held for that one write (a refusal, never an excess). The tokens those
  settles refund are still counted until they are written (a refusal at the edge, never an excess)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import orjson

from gateway.tenancy import allotment
from gateway.tenancy.allotment import Allotment, Demand
from gateway.tenancy.batching import merged
from gateway.tenancy.keys import KeyRecord, UnreadableKey, hash_secret
from gateway.tenancy.limits import Counters, Decision, Limits, Reservation, budget_period
from gateway.tenancy.metrics import LimitMetrics, TenancyMetrics
from gateway.tenancy.store import LEASE_RENEW_S, KeyStore, Settlement, StoreUnavailable, UsageDelta
from gateway.tenancy.ticket import Ticket

log = logging.getLogger("enginegate.tenancy")
HAS_KEYS_TTL_S = 1.0
FLUSH_INTERVAL_S = 1.0
WRITE_GAP_S = 0.01
"""After a write round of more than one settle, the writer waits this long before the next: the settles of a busy
gateway go in about 100 writes a second (merged, batching.py), whatever the request rate; one at a time (a
quiet gateway, a lone client) each goes at once."""
KNOWN_KEYS_MAX = 10_000
RELEASED_MAX = 256
"""The most ended requests' ids one reserve releases (more: the rest are released by their settles)."""
KEY_CACHE_MAX_AGE_S = 5.0
"""The oldest cached key lookup used, whatever the push channel says (the bound if a push is lost unseen)."""
LEASE_HOLD_S = 0.05
"""How long a concurrency lease stays with this process after its request ended, for the key's next request."""
LEASE_REUSE_S = LEASE_RENEW_S
"""The longest a lease is kept for request after request from its reserve: then released, and the next request
reserves afresh (the bound on a slot the store no longer counts, after `release-leases` or a store that lost it)."""


class Refused(Exception):
    def __init__(self, decision: Decision) -> None:
        super().__init__(decision.refused)
        self.decision = decision


class KeyRevoked(Exception):
    """The reserve found the key revoked or rotated since it was authenticated (a 401, like a lookup's None)."""


class Tenancy:
    def __init__(self, store: KeyStore, static: Iterable[tuple[str, KeyRecord]] = (), *, spool: Path | None = None,
                 on_store_error: Literal["closed", "open"] = "closed", metrics: TenancyMetrics | None = None,
                 lease_renew_s: float = LEASE_RENEW_S, allotments: bool = True,
                 limit_metrics: LimitMetrics | None = None) -> None:
        self.store = store
        self.static = {hash_secret(secret): record for secret, record in static}
        self.static_names = {r.name: r for r in self.static.values()}
        self.spool = spool
        self.fail_open = on_store_error == "open"
        self.metrics = metrics
        self._known: dict[str, KeyRecord] = {}  # for on_store_error: open
        self._has_keys: tuple[float, bool] = (-HAS_KEYS_TTL_S, True)  # closed until the store has answered
        self._pending: list[Settlement] = []
        self._tried = 0  # how many of _pending, from the first, a write has tried (and may have applied)
        self._flusher: asyncio.Task[None] | None = None
        self._leases: dict[str, tuple[str, float]] = {}  # lease id -> (key name, when its reserve took it): the
        # leases held here, of requests in flight or kept (monotonic time)
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
        self.allotments = allotments
        self.limit_metrics = limit_metrics
        self._allotted: dict[str, Allotment] = {}  # key name -> what it may still admit here (allotment.py)
        self._demand: dict[str, Demand] = {}
        self._last_counters: dict[str, Counters] = {}  # key name -> its last decision's counters seen here
        self._granting: set[str] = set()  # key names with a grant in flight
        self._grants: set[asyncio.Task[None]] = set()
        self._idle: dict[str, dict[str, tuple[float, str]]] = {}  # key name -> lease id -> (ended at, model)
        self._in_use: dict[str, int] = {}  # key name -> its requests running here with a lease
        self._sweeper: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = False
        self._id_prefix = uuid.uuid4().hex[:20]  # this process's: with a count, ids unique across gateways and restarts
        self._ids = itertools.count()

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
        """The store's watch: a key changed somewhere or the channel came back (True), or it is lost (False).
        Allotments and kept leases go with the cache (the next request of every key asks the store)."""
        self._drop_all()
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
        its secret. A busy key's request may be admitted from its allotment here, with no store call (below)."""
        policy = record.policy
        if not policy.limited:
            return Ticket(record.name, model)
        limits = Limits.of(policy, time.time())
        cost = charge.tokens if limits.tpm or limits.budget else 0  # prompt + max_tokens x n; the settle refunds
        local = self._local(record.name)
        lease = ""
        if local:
            now = time.monotonic()
            demand = self._demand.get(record.name)
            if demand is None:
                if len(self._demand) >= KNOWN_KEYS_MAX:
                    self._demand.clear()
                demand = self._demand[record.name] = Demand()
            demand.seen(now, cost)
            lease = self._idle_lease(record.name) if limits.concurrency else ""
            ticket = self._from_allotment(record, model, limits, cost, charge, lease, now)
            self._refill(record, limits, model, demand, now)
            if ticket is not None:
                return ticket
        try:
            return await self._reserve(record, model, limits, cost, charge, lease)
        except KeyRevoked:
            raise  # its lease is released
        except BaseException:
            if lease:  # refused, or the caller left: the kept lease stays kept
                self._keep_lease(record.name, lease, model)
            raise

    def _slot_taken(self, name: str) -> int:
        """One more request of the key holds a slot here; how many do now."""
        in_use = self._in_use.get(name, 0) + 1
        self._in_use[name] = in_use
        return in_use

    def _new_id(self) -> str:
        """A request id (reserve, settle): unique, and cheaper than a uuid4 per request."""
        return f"{self._id_prefix}{next(self._ids):x}"

    def _local(self, name: str) -> bool:
        """Allotments and kept leases may be used for this key now: on, not closing, and (a stored key) while the
        store's push channel is live, so a revoke anywhere drops them as it empties the lookup cache."""
        return self.allotments and not self._closing and (self._cache_live or name in self.static_names)

    def _from_allotment(self, record: KeyRecord, model: str, limits: Limits, cost: int, charge: Reservation,
                        lease: str, now: float) -> Ticket | None:
        """The request admitted from the key's allotment, when it holds a request and the tokens (and a kept lease,
        for a key with a concurrency cap): no store call."""
        allotted = self._allotted.get(record.name)
        if allotted is None or not allotted.usable(limits, now) or not allotted.fits(cost):
            return None
        if limits.concurrency and not lease:
            return None
        allotted.take(cost)
        decision = allotted.decision(limits, now, self._slot_taken(record.name) if lease else 0)
        if self.limit_metrics is not None:
            self.limit_metrics.in_gateway.inc()
        if not allotted.requests:  # used up: the tokens it still holds go back now, not when it would have ended
            del self._allotted[record.name]
            self._lapse(record.name, allotted)
        return Ticket(record.name, model, limits, decision, charged=cost, estimate=charge.prompt,
                      request_id=self._new_id(), lease_id=lease)

    async def _reserve(self, record: KeyRecord, model: str, limits: Limits, cost: int, charge: Reservation,
                       lease: str) -> Ticket:
        """One reserve in the store. With a kept lease (`lease`) it takes no new one, nor checks the concurrency cap
        (the slot is already counted there)."""
        request_id = self._new_id()  # the gateway's own: a client-sent id could replay another request's charge
        store_limits = dataclasses.replace(limits, concurrency=None) if lease else limits
        releasing = self._releasing.get(record.name) if limits.concurrency else None
        released = tuple(itertools.islice(releasing, RELEASED_MAX)) if releasing else ()
        try:
            decision = await self.store.reserve(record.name, store_limits, cost, request_id,
                                                None if record.static else record.secret_hash, released)
        except StoreUnavailable as exc:
            if not self.fail_open:
                raise
            log.warning("%s: admitting %s without limits (on_store_error: open)", exc, record.name)
            if lease:
                self._keep_lease(record.name, lease, model)
            return Ticket(record.name, model)
        if released and decision.refused != "revoked":  # their leases are gone: no later reserve names them again
            self._forget_releases(record.name, released)
        if decision.refused == "revoked":
            self._revoked(record)
            if lease:
                self._release_lease(record.name, lease, model)
            raise KeyRevoked(record.name)
        if len(self._last_counters) >= KNOWN_KEYS_MAX:
            self._last_counters.clear()
        self._last_counters[record.name] = decision.counters
        if not decision.admitted:
            if self.metrics is not None:
                self.metrics.rejected(record.name, model, decision.refused or "")
            await self._write([Settlement(request_id, record.name, None, 0, False, _usage(record.name, model, rejected=1))])
            raise Refused(decision)
        if self.limit_metrics is not None:
            self.limit_metrics.in_store.inc()
        in_use = self._slot_taken(record.name) if limits.concurrency else 0
        if lease:  # the store counted no slot (it was not asked for one): this gateway's own count
            decision = dataclasses.replace(decision, counters=dataclasses.replace(decision.counters, inflight=in_use))
        if limits.concurrency and not lease:
            lease = request_id
            self._leases[lease] = (record.name, time.monotonic())
            if self._renewer is None or self._renewer.done():
                self._renewer = asyncio.create_task(self._renew_loop())
        return Ticket(record.name, model, limits, decision, charged=cost, estimate=charge.prompt, request_id=request_id,
                      lease_id=lease)

    # -- allotments (allotment.py) ---------------------------------------------------------------
    def _refill(self, record: KeyRecord, limits: Limits, model: str, demand: Demand, now: float) -> None:
        """Ask the store for a grant in the background when the key is busy here and its allotment is missing,
        ending, or half used (one grant in flight per key)."""
        name = record.name
        if name in self._granting:
            return
        allotted = self._allotted.get(name)
        if allotted is not None and allotted.usable(limits, now) and not allotted.low(now):
            return
        requests, unit = allotment.grant_size(demand, limits, self._last_counters.get(name))
        if not requests:
            return
        self._granting.add(name)
        task = asyncio.create_task(self._grant(record, limits, requests, unit, model))
        self._grants.add(task)
        task.add_done_callback(self._grants.discard)

    async def _grant(self, record: KeyRecord, limits: Limits, requests: int, unit: int, model: str) -> None:
        name, generation = record.name, self._cache_generation
        try:
            grant = await self.store.grant(name, limits, requests, unit,
                                           None if record.static else record.secret_hash)
        except Exception as exc:  # a grant is an optimisation: the requests go to the store one by one meanwhile
            log.debug("allotment for %s not granted: %s: %s", name, type(exc).__name__, exc)
            return
        finally:
            self._granting.discard(name)
        if grant.decision.refused == "revoked":
            self._revoked(record)
            return
        self._last_counters[name] = grant.decision.counters
        if not grant.granted:
            return
        if self.limit_metrics is not None:
            self.limit_metrics.granted.inc(grant.granted)
        now = time.monotonic()
        left = self._allotted.pop(name, None)
        carried = left if allotment.carries(left, limits, now) else None
        made = allotment.granted(limits, grant.granted, unit, grant.decision.counters, now, carried, model)
        if left is not None and (made is None or carried is None):
            self._lapse(name, left)  # not carried into the new one: its budget back
        if made is None or self._closing or (not record.static and generation != self._cache_generation):
            if made is not None:  # a key change arrived meanwhile (a revoke?): nothing is admitted from it
                self._lapse(name, made)
            return
        self._allotted[name] = made
        asyncio.get_running_loop().call_later(made.expires - now, self._expire, name, made)

    def _expire(self, name: str, allotted: Allotment) -> None:
        if self._allotted.get(name) is allotted:
            del self._allotted[name]
            self._lapse(name, allotted)

    def _lapse(self, name: str, allotted: Allotment) -> None:
        """An allotment ends: the budget its unused tokens took is given back, recorded on the usage row of the model
        that asked for it (adding nothing there). Its requests and tpm tokens stay counted in their window, which
        ends within TTL_S: a refusal at the edge for others, never an excess."""
        if allotted.limits.budget and allotted.tokens > 0:
            self._enqueue([Settlement(self._new_id(), name, dataclasses.replace(allotted.limits, tpm=None),
                                      -allotted.tokens, False, _usage(name, allotted.model))])
        allotted.requests = allotted.tokens = 0  # given back once, whoever ends it first

    def _revoked(self, record: KeyRecord) -> None:
        """The store no longer holds this key under its secret: nothing of it stays cached or allotted here."""
        self._cache.pop(record.secret_hash, None)
        self._known.pop(record.secret_hash, None)
        self._drop_key(record.name)

    def _drop_key(self, name: str) -> None:
        allotted = self._allotted.pop(name, None)
        if allotted is not None:
            self._lapse(name, allotted)
        for lease, (_, model) in self._idle.pop(name, {}).items():
            self._release_lease(name, lease, model)

    def _drop_all(self) -> None:
        for name in list(self._allotted) + list(self._idle):
            self._drop_key(name)

    def _idle_lease(self, name: str) -> str:
        idle = self._idle.get(name)
        if not idle:
            return ""
        lease = next(iter(idle))
        del idle[lease]
        if not idle:
            del self._idle[name]
        return lease

    def _keep_lease(self, name: str, lease: str, model: str) -> None:
        self._idle.setdefault(name, {})[lease] = (time.monotonic(), model)
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._sweep_loop())

    def _release_lease(self, name: str, lease: str, model: str) -> None:
        """Its release written with the next settles (the settle that ends a lease carries the lease's id)."""
        self._leases.pop(lease, None)
        self._enqueue([Settlement(lease, name, None, 0, True, _usage(name, model))])

    def leases_released(self, name: str) -> None:
        """An admin ended every lease of this key in the store: none of this process's is kept or taken again (the
        requests still running end theirs, which the store no longer counts)."""
        self._idle.pop(name, None)
        for lease in [lease for lease, (holder, _) in self._leases.items() if holder == name]:
            del self._leases[lease]  # a running request's: released by its settle (a no-op now), never kept

    async def _sweep_loop(self) -> None:
        """Release the leases no request of their key took within LEASE_HOLD_S; runs while any is kept."""
        while self._idle:
            await asyncio.sleep(LEASE_HOLD_S / 2)
            now = time.monotonic()
            for name in list(self._idle):
                idle = self._idle[name]
                for lease, (since, model) in list(idle.items()):
                    if now - since >= LEASE_HOLD_S:
                        del idle[lease]
                        self._release_lease(name, lease, model)
                if not idle:
                    del self._idle[name]

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
            leases = [(name, lease) for lease, (name, _) in self._leases.items()]
            if not leases:
                continue
            try:
                await self.store.renew(leases)
            except Exception as exc:  # never stop renewing: a lease missed once may still be renewed in time
                log.warning("renewing %d concurrency lease(s) failed (%s: %s); trying again in %gs",
                            len(leases), type(exc).__name__, exc, self.lease_renew_s)

    async def settle(self, ticket: Ticket, failed: bool, engine_s: float, wait: bool = True) -> None:
        """Write what the request used; `wait`: until its write round ends (the middleware does not wait: its request
        is answered, and its duration must not count the writer's rounds). Its concurrency lease is kept here for
        the key's next request (at most LEASE_HOLD_S) while allotments are on, else released by this settle; the
        settle that ends a lease carries the lease's id, every other settle its request's own."""
        if ticket.settled:
            return
        ticket.settled = True
        prompt = ticket.prompt_used
        completion = ticket.completion_tokens or ticket.streamed_events
        usage = _usage(ticket.name, ticket.model, requests=1, prompt_tokens=prompt, completion_tokens=completion,
                       errors=int(failed or ticket.failed), engine_ms=round(engine_s * 1000))
        if self.metrics is not None:
            self.metrics.settled(usage)
        settle_id, release = ticket.request_id or self._new_id(), False
        lease = ticket.lease_id
        if lease:
            in_use = self._in_use.pop(ticket.name, 1) - 1
            if in_use:
                self._in_use[ticket.name] = in_use
        held = self._leases.get(lease)
        if held is not None and self._local(ticket.name) and time.monotonic() - held[1] < LEASE_REUSE_S:
            self._keep_lease(ticket.name, lease, ticket.model)
            if settle_id == lease:  # the id that will end the lease, later
                settle_id = self._new_id()
        elif lease:
            self._leases.pop(lease, None)  # released by this settle, or it expires
            settle_id, release = lease, True
        settlement = Settlement(settle_id, ticket.name, ticket.limits if ticket.decision else None,
                                ticket.token_delta(), release, usage)
        if wait:
            await self._write([settlement])
        else:
            self._enqueue([settlement])

    # -- writing usage -------------------------------------------------------------------------
    async def _write(self, settlements: list[Settlement]) -> None:
        """Queue them (in order, after what is already waiting) for the writer task and wait for the write
        round that holds them: written, or kept in the buffer when the store failed (closing: close() writes or
        spools them, nobody waits). Never raises."""
        round_done = self._enqueue(settlements)
        if not self._closing:
            await asyncio.shield(round_done)

    def _enqueue(self, settlements: list[Settlement]) -> asyncio.Future[None]:
        """Queue them for the writer task (started unless closing: close() writes what is left; once closed, they go
        to the spool file); the future of the write round that holds them."""
        if self._closed and self.spool is not None:  # a request that outlived the shutdown: replayed at the next start
            self._spool_out(settlements)
            done = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        self._pending.extend(settlements)
        for s in settlements:
            if s.release:
                self._releasing.setdefault(s.name, {})[s.request_id] = None
        if self._next_round is None:
            self._next_round = asyncio.get_running_loop().create_future()
        round_done = self._next_round
        if not self._closing and (self._flusher is None or self._flusher.done()):
            self._flusher = asyncio.create_task(self._flush_loop())
        return round_done

    async def _flush_loop(self) -> None:
        """One store call per round for everything queued, until nothing is; after a failed round it waits
        FLUSH_INTERVAL_S. Never stops on a store's error, whatever it is (flush() turns each into False)."""
        try:
            while self._pending:
                busy = len(self._pending) > 1
                await self.flush()
                if self._failing or busy:
                    await asyncio.sleep(FLUSH_INTERVAL_S if self._failing else WRITE_GAP_S)
        finally:
            for fut in (self._round, self._next_round):  # nobody waits past the writer (close() cancels it)
                if fut is not None and not fut.done():
                    fut.set_result(None)
            self._round = self._next_round = None

    async def flush(self) -> bool:
        """Write what is buffered, in one store call, the settlements never sent merged (batching.py); True when
        nothing is left."""
        fresh = self._pending[self._tried:]
        if len(fresh) > 1:
            self._pending[self._tried:] = merged(fresh)
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
        self._tried = len(batch)  # sent (it may be applied even if the call fails): never merged again
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
        self._tried = 0
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
        """At shutdown: write the buffer, else spool it to a file; nothing is lost (the leases kept and the
        allotments' unused budget are given back with it)."""
        self._closing = True
        for task in (self._flusher, self._renewer, self._watcher, self._sweeper, *self._grants):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._drop_all()
        if not await self.flush() and self.spool is not None:
            self._spool_out(self._pending)
            self._pending.clear()
        self._closed = True
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
