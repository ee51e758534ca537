"""The key store's facts and faults with real processes: `enginegate serve` subprocesses, the real
`enginegate keys` CLI on the same store, a real redis-server switched read-only (a replica of a dead
master, as in a failover) and out of memory (`maxmemory` with noeviction), killed and restarted, and
a gateway killed -9 while it holds a tenant's concurrency slot.

- Revoking every store key does not open the gateway: keys are on until `keys auth-off`.
- A Redis error reply (READONLY, OOM) is a 503 with Retry-After, never a 500; the usage writer
  survives it, writes everything once the fault clears, and frees the slots of the requests that
  ended during it.
- A killed gateway's slots come back within the lease's expiry; `keys release-leases` at once.
- After a Redis restart the next requests find no dead pooled connection (no 503)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis as redis_client

from adapters.process import free_port
from gateway.tenancy.store import LEASE_TTL_MS
from tests.emulators.fixture import RunningEmulator, running_emulator
from tests.gateway_process import REPO_ROOT, RunningGateway, gateway
from tests.redis_server import RedisServer, redis_server

pytestmark = pytest.mark.integration
OPS_SECRET = "ops-secret-5e1d7a93c2"
OPS = {"Authorization": f"Bearer {OPS_SECRET}"}
MODEL = "relayed"


@pytest.fixture(scope="module")
def upstream() -> Iterator[RunningEmulator]:
    with running_emulator("vllm", "--tokens", "8") as emu:
        yield emu


@pytest.fixture(scope="module")
def slow_upstream() -> Iterator[RunningEmulator]:
    with running_emulator("vllm", "--tokens", "150", "--itl-ms", "20") as emu:  # a 3 s stream
        yield emu


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


def models(upstream: RunningEmulator, slow: RunningEmulator | None = None) -> str:
    text = ("models:\n  - source: remote\n    name: relayed\n    engine: openai\n    max_queue: 512\n"
            f"    options: {{base_url: \"{upstream.url}\", upstream_model: emulated-model}}\n")
    if slow is not None:
        text += ("  - source: remote\n    name: slow\n    engine: openai\n"
                 f"    options: {{base_url: \"{slow.url}\", upstream_model: emulated-model}}\n")
    return text


def redis_config(redis: RedisServer, upstream: RunningEmulator, slow: RunningEmulator | None = None,
                 static_admin: bool = True) -> str:
    keys = f"api_keys:\n  - {{key: {OPS_SECRET}, role: admin, name: ops}}\n" if static_admin else ""
    return (keys + f"tenancy: {{redis_url: \"{redis.url}\", redis_prefix: \"t{uuid.uuid4().hex[:12]}:\", "
            "store_timeout_seconds: 0.5}\n" + models(upstream, slow))


def cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", "keys", *args, "--config", str(config)], capture_output=True,
                          text=True, timeout=60, cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, check=False)


def create(config: Path, name: str, *flags: str) -> str:
    made = cli(config, "create", name, *flags, "--json")
    assert made.returncode == 0, made.stderr
    return str(json.loads(made.stdout)["key"])


def chat(gw: RunningGateway, headers: dict[str, str] | None = None, model: str = MODEL) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
    return httpx.post(gw.url + "/v1/chat/completions", json=body, headers=headers or {}, timeout=30)


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def usage(gw: RunningGateway, key: str) -> Counter[str]:
    rows = httpx.get(gw.url + "/admin/usage", params={"key": key}, headers=OPS, timeout=10).json()["data"]
    total: Counter[str] = Counter()
    for row in rows:
        total.update({k: v for k, v in row.items() if isinstance(v, int)})
    return total


def wait_until(check: Any, what: str, limit_s: float = 30.0, every_s: float = 0.2) -> float:
    """Poll until check() holds; the seconds it took (a bounded wait for processes)."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < limit_s, what
        time.sleep(every_s)
    return time.monotonic() - started


class Stream(threading.Thread):
    """A slow streaming request held open in a thread; `started` once its first event arrived."""

    def __init__(self, gw: RunningGateway, secret: str) -> None:
        super().__init__(daemon=True)
        self.gw, self.secret = gw, secret
        self.started = threading.Event()
        self.status = 0
        self.events = 0

    def run(self) -> None:
        body = {"model": "slow", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        try:
            with httpx.stream("POST", self.gw.url + "/v1/chat/completions", json=body, headers=bearer(self.secret),
                              timeout=60) as r:
                self.status = r.status_code
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.events += 1
                        self.started.set()
        except httpx.HTTPError:
            pass  # its gateway was killed
        finally:
            self.started.set()


# -- keys are on until turned off -------------------------------------------------------------------

@pytest.mark.parametrize("store", ["sqlite", "redis"])
def test_revoking_every_store_key_leaves_authentication_on_until_auth_off(
        store: str, upstream: RunningEmulator, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    config = tmp_path / "gateway.yaml"
    if store == "sqlite":
        config.write_text(f"tenancy: {{path: \"{tmp_path / 'keys.sqlite3'}\"}}\n" + models(upstream))
    else:
        config.write_text(redis_config(request.getfixturevalue("redis"), upstream, static_admin=False))
    admin, user = create(config, "ops", "--role", "admin"), create(config, "team-a")
    with gateway(["--config", str(config)]) as gw:
        assert chat(gw, bearer(user)).status_code == 200
        assert httpx.get(gw.url + "/admin/usage", headers=bearer(admin), timeout=10).status_code == 200
        for name in ("team-a", "ops"):
            revoked = cli(config, "revoke", name)
            assert revoked.returncode == 0, revoked.stderr
        time.sleep(1.2)  # past the gateway's one-second memo of "keys are on"
        closed = [chat(gw), httpx.get(gw.url + "/admin/usage", timeout=10), httpx.get(gw.url + "/admin/engines", timeout=10),
                  httpx.post(gw.url + f"/admin/models/{MODEL}/unload", timeout=10)]
        assert [r.status_code for r in closed] == [401] * 4, [r.text[:120] for r in closed]
        assert all(r.json()["error"]["code"] == "invalid_api_key" for r in closed)
        for secret in (admin, user):  # a revoked key stays refused
            assert httpx.post(gw.url + f"/admin/models/{MODEL}/unload", headers=bearer(secret), timeout=10).status_code == 401
            assert chat(gw, bearer(secret)).status_code == 401

        late = create(config, "late")
        refused = cli(config, "auth-off")
        assert refused.returncode == 1 and "late is active" in refused.stderr
        assert chat(gw).status_code == 401
        assert cli(config, "revoke", "late").returncode == 0
        off = cli(config, "auth-off")
        assert off.returncode == 0, off.stderr
        wait_until(lambda: chat(gw).status_code == 200, "auth-off did not open the gateway", limit_s=10)
        assert chat(gw, bearer(late)).status_code == 200  # open: a revoked key is no key (the model was never unloaded)
        assert "Traceback" not in gw.log()


# -- Redis error replies ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def faulty(redis: RedisServer, upstream: RunningEmulator, slow_upstream: RunningEmulator) -> Iterator[RunningGateway]:
    with gateway(config_yaml=redis_config(redis, upstream, slow_upstream)) as gw:
        yield gw


def new_key(gw: RunningGateway, name: str, **policy: Any) -> str:
    r = httpx.post(gw.url + "/admin/keys", json={"name": name, **policy}, headers=OPS, timeout=10)
    assert r.status_code == 200, r.text
    return str(r.json()["key"])


@pytest.mark.parametrize("fault", ["readonly", "oom"])
def test_a_redis_error_reply_is_a_503_and_the_usage_and_slots_come_back(
        fault: str, faulty: RunningGateway, redis: RedisServer) -> None:
    gw = faulty
    secret = new_key(gw, f"cap-{fault}", max_concurrency=2, rpm=1000)
    name = f"cap-{fault}"
    other = new_key(gw, f"other-{fault}", rpm=1000)
    ops_before = usage(gw, "ops")["requests"]
    streams = [Stream(gw, secret) for _ in range(2)]
    for s in streams:
        s.start()
    assert all(s.started.wait(30) for s in streams) and all(s.status == 200 for s in streams)
    assert chat(gw, bearer(secret)).status_code == 429  # both slots held

    raw = redis_client.Redis.from_url(redis.url)
    raw.execute_command(*(("REPLICAOF", "127.0.0.1", str(free_port())) if fault == "readonly"
                          else ("CONFIG", "SET", "maxmemory", "1")))
    try:
        for s in streams:
            s.join(60)  # they end during the fault: their settles (and slot releases) wait in memory
        assert all(s.events > 100 for s in streams)
        held = chat(gw, bearer(secret))  # its reserve would end the two ended streams' leases, and cannot write
        assert held.status_code == 503 and held.json()["error"]["code"] == "store_unavailable", held.text
        for _ in range(3):
            r = chat(gw, bearer(other))
            assert r.status_code == 503, r.text  # the key authenticates (a read), admission cannot write
            assert r.json()["error"]["code"] == "store_unavailable" and int(r.headers["retry-after"]) >= 1
            assert chat(gw, OPS).status_code == 200  # the config file's key: served, its usage buffered
        time.sleep(1.5)  # the usage writer meets the error reply at least once
    finally:
        raw.execute_command(*(("REPLICAOF", "NO", "ONE") if fault == "readonly" else ("CONFIG", "SET", "maxmemory", "0")))
        raw.close()
    took = wait_until(lambda: usage(gw, "ops")["requests"] >= ops_before + 3, "buffered usage was never written")
    both = asyncio.run(_burst(gw, secret, 2))
    assert [r.status_code for r in both] == [200, 200]  # the slots were freed by the buffered settles, not by expiry
    assert usage(gw, "ops")["requests"] == ops_before + 3  # each buffered request written once
    spent = usage(gw, name)
    assert (spent["requests"], spent["rejected"], spent["errors"]) == (4, 1, 0), spent  # 2 streams + 2 chats; one 429
    print(f"\n{fault}: buffered usage written {took:.1f}s after the fault cleared; both slots free again")
    log = gw.log()
    assert "Traceback" not in log and " 500 " not in log


async def _burst(gw: RunningGateway, secret: str, n: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=30) as client:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        return await asyncio.gather(*(client.post(gw.url + "/v1/chat/completions", json=body, headers=bearer(secret))
                                      for _ in range(n)))


# -- a killed gateway's slots ----------------------------------------------------------------------

@pytest.mark.parametrize("store", ["sqlite", "redis"])
def test_a_gateway_killed_holding_a_slot_gives_it_back_within_the_lease(
        store: str, upstream: RunningEmulator, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    config = tmp_path / "gateway.yaml"
    with running_emulator("vllm", "--tokens", "3000", "--itl-ms", "20") as endless:  # a minute-long stream
        if store == "redis":
            config.write_text(redis_config(request.getfixturevalue("redis"), upstream, endless))
        else:  # two gateways on one SQLite file
            config.write_text(f"tenancy: {{path: \"{tmp_path / 'keys.sqlite3'}\"}}\n" + models(upstream, endless))
        _killed_gateway_then_reset(config)


def _killed_gateway_then_reset(config: Path) -> None:
    solo = create(config, "solo", "--max-concurrency", "1")
    with gateway(["--config", str(config)]) as survivor:
        with gateway(["--config", str(config)]) as doomed:
            held = Stream(doomed, solo)
            held.start()
            assert held.started.wait(30) and held.status == 200
            os.killpg(doomed.process.pid, signal.SIGKILL)  # no settle, no release: only the lease's expiry
            doomed.process.wait()
            killed_at = time.monotonic()
        first = chat(survivor, bearer(solo))
        assert first.status_code == 429 and first.json()["error"]["code"] == "rate_limit_exceeded"
        wait_until(lambda: chat(survivor, bearer(solo)).status_code == 200,
                   "the dead gateway's slot never came back", limit_s=LEASE_TTL_MS / 1000 + 10, every_s=1.0)
        back = time.monotonic() - killed_at
        print(f"\nkill -9 of the gateway holding the only slot: admitted again after {back:.1f}s "
              f"(lease {LEASE_TTL_MS / 1000:g}s, renewed every 10s)")
        assert back <= LEASE_TTL_MS / 1000 + 5

        again = Stream(survivor, solo)  # the admin reset: a slot taken now is freed at once
        again.start()
        assert again.started.wait(30) and again.status == 200
        assert chat(survivor, bearer(solo)).status_code == 429
        reset = cli(config, "release-leases", "solo", "--json")
        assert reset.returncode == 0 and json.loads(reset.stdout) == {"name": "solo", "released": 1}, reset.stderr
        assert chat(survivor, bearer(solo)).status_code == 200  # while the stream runs on (ended by the shutdown)
        assert "Traceback" not in survivor.log()


# -- a Redis restart --------------------------------------------------------------------------------

def test_after_a_redis_restart_the_next_requests_get_no_503(faulty: RunningGateway, redis: RedisServer) -> None:
    gw = faulty
    secret = new_key(gw, "restart", rpm=10_000)
    assert [r.status_code for r in asyncio.run(_burst(gw, secret, 10))] == [200] * 10  # ten pooled connections
    for round_ in range(2):
        redis.kill()
        redis.start()  # answers PING: the gateway's pooled connections are all dead
        codes = Counter(r.status_code for r in asyncio.run(_burst(gw, secret, 10)))
        sequential = Counter(chat(gw, bearer(secret)).status_code for _ in range(10))
        print(f"\nredis restart {round_ + 1}: a burst of 10 {dict(codes)}, then 10 one by one {dict(sequential)}")
        assert codes == {200: 10} and sequential == {200: 10}
    assert "Traceback" not in gw.log()
