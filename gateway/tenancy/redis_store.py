"""The shared key store: Redis, for several gateway processes or pods enforcing one set of limits.

Every change is one Lua script (atomic on the server): the limit decision checks and charges in
one step, so N gateways never hand out a limit N times. Key layout, under `prefix`:

    keys      hash  name -> record (JSON, with the secret's hash)
    active    hash  name -> secret hash (unrevoked keys only)
    secrets   hash  secret hash -> name
    auth      string "1" or "0": keys are on (absent in a store written before it: on when `keys` has any record)
    w:{name}:requests, w:{name}:tokens   counters of the current window (PEXPIRE = the window)
    leases:{name}                        sorted set of the running requests' ids, scored by their lease's expiry
                                         (server time, ms); expired members are removed before counting
    budget:{name}:{period}               tokens spent in the budget period
    usage:{day}:{name}:{model}           hash of usage counters; `usage` is the set of those (day, name, model)
    applied:r:{id}, applied:s:{id}       a request id reserved / settled (SET NX, expires after APPLIED_KEEP_MS)
    keys-changed                         pub/sub channel: a key's name, published by the script that revoked
                                         or rotated it (`watch` subscribes on a connection of its own)

Every script is safe to run twice (a create or change already applied answers done, reserve and
settle apply each request id once), so a call that timed out, which Redis may have run, is
retried once, as is one that found a pooled connection dead (a restarted server).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import orjson

from gateway.tenancy.keys import KeyRecord
from gateway.tenancy.limits import Counters, Decision, Limits
from gateway.tenancy.store import (
    APPLIED_KEEP_MS,
    LEASE_TTL_MS,
    USAGE_FIELDS,
    Grant,
    KeyExists,
    KeysActive,
    Settlement,
    WATCH_DEAD_S,
    WATCH_PING_S,
    StoreUnavailable,
)

T = TypeVar("T")
SEP = "\x1f"
BUDGET_KEEP_MS = 86400_000

LOOKUP = """
local name = redis.call('HGET', KEYS[1], ARGV[1])
if not name then return false end
return redis.call('HGET', KEYS[2], name)
"""
NOW = "local now_t = redis.call('TIME'); local now = tonumber(now_t[1]) * 1000 + math.floor(tonumber(now_t[2]) / 1000)\n"
AUTH = """
local v = redis.call('GET', KEYS[1])
if v then return v == '1' and 1 or 0 end
return redis.call('HLEN', KEYS[2]) > 0 and 1 or 0
"""
# KEYS: active, auth
DISABLE_AUTH = """
local active = redis.call('HKEYS', KEYS[1])
if #active > 0 then return active[1] end
redis.call('SET', KEYS[2], '0')
return ''
"""
# KEYS: keys, active, secrets, auth. ARGV: name, hash, record
CREATE = """
local current = redis.call('HGET', KEYS[2], ARGV[1])
if current then return current == ARGV[2] and 1 or 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[3], ARGV[2], ARGV[1])
redis.call('SET', KEYS[4], '1')
return 1
"""
# KEYS: keys, active, secrets, the keys-changed channel. ARGV: name, expected (current) hash, new hash or '' (revoke), new record
CHANGE = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[4] then return 1 end
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[3], ARGV[2])
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[2], ARGV[1])
else
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
  redis.call('HSET', KEYS[3], ARGV[3], ARGV[1])
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[4])
redis.call('PUBLISH', KEYS[4], ARGV[1])
return 1
"""
# Reads first, and the first write one that needs memory (INCR, ZADD...): under OOM (noeviction) Redis refuses
# that one, and so the whole call, where a write before it would have let the script run on regardless. So the
# `released` leases (of requests that ended) are counted out by reading them, and removed only after that write
# (or, refused, as the call's only writes: ZREM needs no memory).
# KEYS: requests window, tokens window, leases, budget, applied:r:{id}, active.
# ARGV: rpm tpm conc budget (0 = no limit) window_ms budget_ttl_ms cost lease_ttl_ms request_id keep_ms
#       name secret_hash ('': not checked), then the ids of ended requests whose leases end first (`released`)
RESERVE = NOW + """
if ARGV[12] ~= '' and redis.call('HGET', KEYS[6], ARGV[11]) ~= ARGV[12] then return {'revoked', 0, 0, 0, 0, 0, 0} end
local rpm, tpm, conc, budget = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local window, budget_ttl, cost, lease_ttl = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local function get(k) return tonumber(redis.call('GET', k) or '0') end
local function reset(k) local t = redis.call('PTTL', k); if t < 0 then return window end; return t end
local r, rr, t, tr, c, b = 0, 0, 0, 0, 0, 0
if rpm > 0 then r = get(KEYS[1]); rr = reset(KEYS[1]) end
if tpm > 0 then t = get(KEYS[2]); tr = reset(KEYS[2]) end
if conc > 0 then
  c = redis.call('ZCOUNT', KEYS[3], '(' .. now, '+inf')
  for i = 13, #ARGV do
    local s = redis.call('ZSCORE', KEYS[3], ARGV[i])
    if s and tonumber(s) > now then c = c - 1 end
  end
end
if budget > 0 then b = get(KEYS[4]) end
if redis.call('EXISTS', KEYS[5]) == 1 then return {'', r, rr, t, tr, c, b} end
local refused = ''
if rpm > 0 and r >= rpm then refused = 'requests'
elseif tpm > 0 and t > 0 and t + cost > tpm then refused = 'tokens'
elseif conc > 0 and c >= conc then refused = 'concurrency'
elseif budget > 0 and b + cost > budget then refused = 'budget' end
if refused == '' then
  if rpm > 0 then r = redis.call('INCR', KEYS[1]); if r == 1 then redis.call('PEXPIRE', KEYS[1], window) end end
  if tpm > 0 then t = redis.call('INCRBY', KEYS[2], cost); if redis.call('PTTL', KEYS[2]) < 0 then redis.call('PEXPIRE', KEYS[2], window) end end
  if conc > 0 then
    redis.call('ZADD', KEYS[3], now + lease_ttl, ARGV[9]); c = c + 1; redis.call('PEXPIRE', KEYS[3], lease_ttl)
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  end
  if budget > 0 then b = redis.call('INCRBY', KEYS[4], cost); redis.call('PEXPIRE', KEYS[4], budget_ttl) end
  redis.call('SET', KEYS[5], '1', 'PX', ARGV[10])
end
for i = 13, #ARGV do redis.call('ZREM', KEYS[3], ARGV[i]) end
return {refused, r, rr, t, tr, c, b}
"""
# A grant (store.py): the counters read once, each request decided in order as RESERVE would (no lease, no
# applied id: a grant is never replayed), the total written once.
# KEYS: requests window, tokens window, budget, active.
# ARGV: rpm tpm budget (0 = no limit) window_ms budget_ttl_ms unit_cost requests name secret_hash ('': not checked)
# Returns {granted, refusal of the first not granted or '', requests, reset, tokens, reset, budget used}.
GRANT = """
if ARGV[9] ~= '' and redis.call('HGET', KEYS[4], ARGV[8]) ~= ARGV[9] then return {0, 'revoked', 0, 0, 0, 0, 0} end
local rpm, tpm, budget = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local window, budget_ttl, unit, want = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local function get(k) return tonumber(redis.call('GET', k) or '0') end
local function reset(k) local t = redis.call('PTTL', k); if t < 0 then return window end; return t end
local r, rr, t, tr, b = 0, 0, 0, 0, 0
if rpm > 0 then r = get(KEYS[1]); rr = reset(KEYS[1]) end
if tpm > 0 then t = get(KEYS[2]); tr = reset(KEYS[2]) end
if budget > 0 then b = get(KEYS[3]) end
local n, refused = 0, ''
while n < want do
  if rpm > 0 and r + n >= rpm then refused = 'requests'
  elseif tpm > 0 and t + n * unit > 0 and t + (n + 1) * unit > tpm then refused = 'tokens'
  elseif budget > 0 and b + (n + 1) * unit > budget then refused = 'budget' end
  if refused ~= '' then break end
  n = n + 1
end
if n == 0 then return {0, refused, r, rr, t, tr, b} end
if rpm > 0 then r = redis.call('INCRBY', KEYS[1], n); if r == n then redis.call('PEXPIRE', KEYS[1], window) end end
if tpm > 0 then
  t = redis.call('INCRBY', KEYS[2], n * unit); if redis.call('PTTL', KEYS[2]) < 0 then redis.call('PEXPIRE', KEYS[2], window) end
end
if budget > 0 then b = redis.call('INCRBY', KEYS[3], n * unit); redis.call('PEXPIRE', KEYS[3], budget_ttl) end
return {n, '', r, rr, t, tr, b}
"""
# KEYS: leases, tokens window, budget, usage hash, usage index, applied:s:{id}.
# ARGV: release tpm budget delta window_ms budget_ttl_ms member request_id keep_ms, then usage field/value pairs
SETTLE = """
if not redis.call('SET', KEYS[6], '1', 'NX', 'PX', ARGV[9]) then return 0 end
if ARGV[1] == '1' then redis.call('ZREM', KEYS[1], ARGV[8]) end
local d = tonumber(ARGV[4])
local function add(k, ttl)
  if redis.call('INCRBY', k, d) < 0 then redis.call('SET', k, 0, 'KEEPTTL') end
  if redis.call('PTTL', k) < 0 then redis.call('PEXPIRE', k, ttl) end
end
if ARGV[2] == '1' and d ~= 0 then add(KEYS[2], ARGV[5]) end
if ARGV[3] == '1' and d ~= 0 then add(KEYS[3], ARGV[6]) end
for i = 10, #ARGV, 2 do
  if ARGV[i + 1] ~= '0' then redis.call('HINCRBY', KEYS[4], ARGV[i], ARGV[i + 1]) end
end
redis.call('SADD', KEYS[5], ARGV[7])
return 1
"""
# KEYS: leases. ARGV: lease_ttl_ms, then request ids: each lease not yet expired is extended
RENEW = NOW + """
local ttl = tonumber(ARGV[1])
local n = 0
for i = 2, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) > now then redis.call('ZADD', KEYS[1], 'XX', now + ttl, ARGV[i]); n = n + 1 end
end
if n > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
return n
"""
# KEYS: leases. The live leases there were, all ended
RELEASE = NOW + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local n = redis.call('ZCARD', KEYS[1])
redis.call('DEL', KEYS[1])
return n
"""


class RedisKeyStore:
    def __init__(self, url: str, prefix: str = "enginegate:", timeout_s: float = 2.0,
                 lease_ttl_ms: int = LEASE_TTL_MS) -> None:
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        self.url = url
        self.p = prefix
        self.lease_ttl_ms = lease_ttl_ms
        # one retry, at once, of a call that met a dead pooled connection or a timeout: every script is idempotent
        self.client = aioredis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                              health_check_interval=30, retry=Retry(NoBackoff(), 1))
        self._auth = self.client.register_script(AUTH)
        self._disable_auth = self.client.register_script(DISABLE_AUTH)
        self._lookup = self.client.register_script(LOOKUP)
        self._create = self.client.register_script(CREATE)
        self._change = self.client.register_script(CHANGE)
        self._reserve = self.client.register_script(RESERVE)
        self._settle = self.client.register_script(SETTLE)
        self._grant = self.client.register_script(GRANT)
        self._renew = self.client.register_script(RENEW)
        self._release = self.client.register_script(RELEASE)

    async def _run(self, call: Callable[[], Awaitable[T]]) -> T:
        from redis.exceptions import RedisError

        try:
            return await call()
        except (RedisError, OSError) as exc:  # an error reply too (READONLY in a failover, OOM): the store is not usable now
            raise StoreUnavailable(f"key store {self._where()}: {type(exc).__name__}: {exc}") from exc

    def _where(self) -> str:
        kw = self.client.connection_pool.connection_kwargs
        return f"redis://{kw.get('host', '?')}:{kw.get('port', '?')}/{kw.get('db', 0)}"  # never the URL's password

    @property
    def _hashes(self) -> list[str]:
        return [self.p + "keys", self.p + "active", self.p + "secrets", self.p + "auth"]

    async def lookup(self, secret_hash: str) -> KeyRecord | None:
        raw = await self._run(lambda: self._lookup(keys=[self.p + "secrets", self.p + "keys"], args=[secret_hash]))
        return KeyRecord.from_json(orjson.loads(raw)) if raw else None

    async def get(self, name: str) -> KeyRecord | None:
        raw = await self._run(lambda: self.client.hget(self.p + "keys", name))
        return KeyRecord.from_json(orjson.loads(raw)) if raw else None

    async def auth_enabled(self) -> bool:
        return bool(await self._run(lambda: self._auth(keys=[self.p + "auth", self.p + "keys"])))

    async def disable_auth(self) -> None:
        active = await self._run(lambda: self._disable_auth(keys=[self.p + "active", self.p + "auth"]))
        if active:
            raise KeysActive(active.decode() if isinstance(active, bytes) else str(active))

    async def list(self) -> list[KeyRecord]:
        raw = await self._run(lambda: self.client.hgetall(self.p + "keys"))
        return sorted((KeyRecord.from_json(orjson.loads(v)) for v in raw.values()), key=lambda r: r.name)

    async def create(self, record: KeyRecord) -> None:
        made = await self._run(lambda: self._create(keys=self._hashes,
                                                    args=[record.name, record.secret_hash, orjson.dumps(record.to_json())]))
        if not made:
            raise KeyExists(record.name)

    async def revoke(self, name: str, at: float) -> KeyRecord | None:
        return await self._change_record(name, lambda r: replace(r, revoked_at=at), "")

    async def replace_secret(self, name: str, secret_hash: str) -> KeyRecord | None:
        return await self._change_record(name, lambda r: replace(r, secret_hash=secret_hash), secret_hash)

    async def _change_record(self, name: str, change: Callable[[KeyRecord], KeyRecord], new_hash: str) -> KeyRecord | None:
        current = await self.get(name)
        if current is None or current.revoked_at is not None:
            return None
        record = change(current)
        done = await self._run(lambda: self._change(keys=[*self._hashes[:3], self.p + "keys-changed"], args=[
            name, current.secret_hash, new_hash, orjson.dumps(record.to_json())]))
        return record if done else None

    async def reserve(self, name: str, limits: Limits, cost: int, request_id: str,
                      secret_hash: str | None = None, released: Sequence[str] = ()) -> Decision:
        keys = [f"{self.p}w:{name}:requests", f"{self.p}w:{name}:tokens", f"{self.p}leases:{name}",
                f"{self.p}budget:{name}:{limits.budget_period}", f"{self.p}applied:r:{request_id}", self.p + "active"]
        args = [limits.rpm or 0, limits.tpm or 0, limits.concurrency or 0, limits.budget or 0, limits.window_ms,
                limits.budget_reset_ms + BUDGET_KEEP_MS, cost, self.lease_ttl_ms, request_id, APPLIED_KEEP_MS,
                name, secret_hash or "", *released]
        out = await self._run(lambda: self._reserve(keys=keys, args=args))
        refused = out[0].decode() if isinstance(out[0], bytes) else str(out[0])
        counters = Counters(*(int(v) for v in out[1:7]))
        return Decision(limits, counters, refused or None)  # type: ignore[arg-type]

    async def grant(self, name: str, limits: Limits, requests: int, unit_cost: int,
                    secret_hash: str | None = None) -> Grant:
        """One call of the GRANT script."""
        keys = [f"{self.p}w:{name}:requests", f"{self.p}w:{name}:tokens", f"{self.p}budget:{name}:{limits.budget_period}",
                self.p + "active"]
        args = [limits.rpm or 0, limits.tpm or 0, limits.budget or 0, limits.window_ms,
                limits.budget_reset_ms + BUDGET_KEEP_MS, unit_cost, requests, name, secret_hash or ""]
        out = await self._run(lambda: self._grant(keys=keys, args=args))
        refused = out[1].decode() if isinstance(out[1], bytes) else str(out[1])
        r, rr, t, tr, b = (int(v) for v in out[2:7])
        counters = Counters(r if limits.rpm else 0, rr, t if limits.tpm else 0, tr, 0, b if limits.budget else 0)
        return Grant(int(out[0]), Decision(limits, counters, refused or None))  # type: ignore[arg-type]

    def _settle_call(self, s: Settlement) -> tuple[list[str], list[Any]]:
        u, limits = s.usage, s.limits
        keys = [f"{self.p}leases:{s.name}", f"{self.p}w:{s.name}:tokens",
                f"{self.p}budget:{s.name}:{limits.budget_period if limits else '-'}",
                f"{self.p}usage:{u.day}:{u.name}:{u.model}", self.p + "usage", f"{self.p}applied:s:{s.request_id}"]
        args: list[Any] = [
            int(s.release), int(bool(limits and limits.tpm)),
            int(bool(limits and limits.budget)), s.token_delta, limits.window_ms if limits else 1,
            (limits.budget_reset_ms + BUDGET_KEEP_MS) if limits else 1, SEP.join((u.day, u.name, u.model)),
            s.request_id, APPLIED_KEEP_MS]
        for f in USAGE_FIELDS:
            args += [f, getattr(u, f)]
        return keys, args

    async def settle(self, settlements: list[Settlement]) -> None:
        async def run() -> None:
            if len(settlements) == 1:  # the common case: one round trip, no pipeline
                keys, args = self._settle_call(settlements[0])
                await self._settle(keys=keys, args=args)
                return
            async with self.client.pipeline(transaction=False) as pipe:
                for s in settlements:
                    keys, args = self._settle_call(s)
                    await self._settle(keys=keys, args=args, client=pipe)
                await pipe.execute()

        await self._run(run)

    async def renew(self, leases: list[tuple[str, str]]) -> None:
        by_name: dict[str, list[str]] = {}
        for name, request_id in leases:
            by_name.setdefault(name, []).append(request_id)
        if not by_name:
            return

        async def run() -> None:
            async with self.client.pipeline(transaction=False) as pipe:
                for name, ids in by_name.items():
                    await self._renew(keys=[f"{self.p}leases:{name}"], args=[self.lease_ttl_ms, *ids], client=pipe)
                await pipe.execute()

        await self._run(run)

    async def release_leases(self, name: str) -> int:
        return int(await self._run(lambda: self._release(keys=[f"{self.p}leases:{name}"])))

    async def usage(self, name: str | None = None, since: str | None = None) -> list[dict[str, Any]]:
        async def run() -> list[dict[str, Any]]:
            members = sorted(m.decode().split(SEP) for m in await self.client.smembers(self.p + "usage"))
            wanted = [(day, n, model) for day, n, model in members
                      if (name is None or n == name) and (since is None or day >= since)]
            async with self.client.pipeline(transaction=False) as pipe:
                for day, n, model in wanted:
                    pipe.hgetall(f"{self.p}usage:{day}:{n}:{model}")
                values = await pipe.execute()
            return [{"name": n, "model": model, "day": day, **{f: int(v.get(f.encode(), 0)) for f in USAGE_FIELDS}}
                    for (day, n, model), v in zip(wanted, values, strict=True)]

        rows = await self._run(run)
        return sorted(rows, key=lambda r: (r["day"], r["name"], r["model"]))

    async def watch(self, changed: Callable[[bool], None]) -> None:
        """Subscribed to keys-changed on a connection of its own; a PING every WATCH_PING_S proves it alive."""
        from redis.exceptions import RedisError

        while True:
            pubsub = self.client.pubsub()
            live = False
            try:
                await pubsub.subscribe(self.p + "keys-changed")
                heard = time.monotonic()
                pinged = heard
                while True:
                    message = await pubsub.get_message(timeout=WATCH_PING_S)
                    now = time.monotonic()
                    if message is not None:
                        heard = now
                        kind = message.get("type")
                        if kind == "subscribe" or (kind == "message" and live):
                            live = True  # subscribed: from here on every change is heard
                            changed(True)
                    if now - heard > WATCH_DEAD_S:
                        raise TimeoutError(f"no answer on the key channel for {WATCH_DEAD_S:g} s")
                    if now - pinged >= WATCH_PING_S:
                        pinged = now
                        await pubsub.ping()  # its pong is a message: `heard`
            except (RedisError, OSError, TimeoutError):
                pass
            finally:
                if live:
                    changed(False)
                try:
                    await pubsub.aclose()
                except Exception:  # closing a connection to a dead server
                    pass
            await asyncio.sleep(WATCH_PING_S)

    async def close(self) -> None:
        try:
            await self.client.aclose()
        except Exception:  # closing a connection to a dead server: nothing left to release
            pass
