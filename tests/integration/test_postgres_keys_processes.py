"""Keys in the shared PostgreSQL database, the way an operator runs them: a real PostgreSQL (Debian's,
tests/postgres_server.py), two `enginegate serve` processes with separate data directories and one
ENGINEGATE_DATABASE_URL, in front of the engine emulator, and `enginegate keys` / `enginegate usage`
run as commands with the same variable. A key made by the command works on both gateways at once,
revoked on one it is refused on the other, rpm holds across both (not doubled), and the database
stopped answers 503 in the API's shape with Retry-After in time, then recovers by itself."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.emulators.fixture import RunningEmulator, running_emulator
from tests.gateway_process import REPO_ROOT, RunningGateway, gateway
from tests.postgres_server import PostgresServer, postgres_server

pytestmark = pytest.mark.integration
ADMIN_SECRET = "admin-secret-pg-4c1d9e7a2b"
ADMIN = {"Authorization": f"Bearer {ADMIN_SECRET}"}
MODEL = "relayed"
STORE_TIMEOUT_S = 2.0  # the default: a burst of 80 on a busy 2-core machine needs more than 0.5 s for new connections
REVOKE_WAIT_S = 5.0


@pytest.fixture(scope="module")
def upstream() -> Iterator[RunningEmulator]:
    with running_emulator("vllm", "--tokens", "4") as emu:
        yield emu


@pytest.fixture(scope="module")
def database() -> Iterator[tuple[PostgresServer, str]]:
    """A server of this module's own: the fault test stops and starts it."""
    with postgres_server() as server:
        yield server, server.createdb("enginegate")


def env_for(url: str) -> dict[str, str]:
    return {"ENGINEGATE_DATABASE_URL": url, "XDG_DATA_HOME": tempfile.mkdtemp(prefix="enginegate-data-")}


@pytest.fixture(scope="module")
def gateways(upstream: RunningEmulator, database: tuple[PostgresServer, str]) -> Iterator[tuple[RunningGateway, RunningGateway]]:
    _, url = database
    yaml = (f"api_keys:\n  - {{key: {ADMIN_SECRET}, role: admin, name: ops}}\n"
            f"tenancy: {{store_timeout_seconds: {STORE_TIMEOUT_S}}}\n"
            "models:\n  - source: remote\n    name: relayed\n    engine: openai\n    max_queue: 512\n"
            f"    options: {{base_url: \"{upstream.url}\", upstream_model: emulated-model}}\n")
    with gateway(config_yaml=yaml, env=env_for(url)) as one, gateway(config_yaml=yaml, env=env_for(url)) as two:
        yield one, two


def enginegate(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The command, as an operator runs it: its own data directory, only the database URL in common."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **env_for(url)}
    return subprocess.run([sys.executable, "-m", "gateway", *args], env=env, cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=60)


def create_key(url: str, name: str, *flags: str) -> str:
    done = enginegate(url, "keys", "create", name, "--json", *flags)
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)["key"])


def chat(gw: RunningGateway, secret: str) -> httpx.Response:
    return httpx.post(gw.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {secret}"}, timeout=30,
                      json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})


async def burst(gws: tuple[RunningGateway, ...], secret: str, n: int) -> list[httpx.Response]:
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=n)) as client:
        return await asyncio.gather(*(client.post(gws[i % len(gws)].url + "/v1/chat/completions", json=body,
                                                  headers={"Authorization": f"Bearer {secret}"}) for i in range(n)))


def test_a_key_made_by_the_command_works_on_both_gateways_and_a_revoke_on_one_reaches_the_other(
        gateways: tuple[RunningGateway, RunningGateway], database: tuple[PostgresServer, str]) -> None:
    one, two = gateways
    _, url = database
    secret = create_key(url, "team-a")
    for gw in gateways:  # both gateways at once, neither of them told: the key is in the database
        client = openai.OpenAI(base_url=gw.base_url, api_key=secret, max_retries=0)
        assert client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4).choices
    listed = enginegate(url, "keys", "list", "--json")
    assert listed.returncode == 0 and [k["name"] for k in json.loads(listed.stdout)] == ["team-a"]
    assert secret not in listed.stdout

    assert httpx.post(one.url + "/admin/keys/team-a/revoke", headers=ADMIN, timeout=10).status_code == 200
    deadline = time.monotonic() + REVOKE_WAIT_S
    while (r := chat(two, secret)).status_code == 200:
        assert time.monotonic() < deadline, f"the key revoked on one gateway still works on the other after {REVOKE_WAIT_S} s"
        time.sleep(0.1)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert chat(one, secret).status_code == 401

    usage = enginegate(url, "usage", "--key", "team-a", "--json")
    assert usage.returncode == 0, usage.stderr
    assert sum(row["requests"] for row in json.loads(usage.stdout)) == 2  # one on each gateway, in one ledger


def test_rotate_through_the_command_reaches_both_gateways(gateways: tuple[RunningGateway, RunningGateway],
                                                         database: tuple[PostgresServer, str]) -> None:
    _, url = database
    old = create_key(url, "rotating")
    done = enginegate(url, "keys", "rotate", "rotating", "--json")
    assert done.returncode == 0, done.stderr
    new = json.loads(done.stdout)["key"]
    for gw in gateways:
        assert chat(gw, old).status_code == 401 and chat(gw, new).status_code == 200
    assert enginegate(url, "keys", "revoke", "rotating").returncode == 0
    assert all(chat(gw, new).status_code == 401 for gw in gateways)


def test_rpm_is_exact_across_two_gateways(gateways: tuple[RunningGateway, RunningGateway],
                                          database: tuple[PostgresServer, str]) -> None:
    one, two = gateways
    _, url = database
    secret = create_key(url, "burst", "--rpm", "30")
    answers = asyncio.run(burst(gateways, secret, 80))
    statuses = Counter(r.status_code for r in answers)
    print(f"\nrpm 30 across two gateways on PostgreSQL, 80 requests at once: {dict(statuses)}")
    assert statuses == {200: 30, 429: 50}  # the limit once, not once per gateway
    refused = next(r for r in answers if r.status_code == 429)
    assert refused.json()["error"]["code"] == "rate_limit_exceeded" and int(refused.headers["retry-after"]) > 0
    assert {r.request.url.port for r in answers} == {one.port, two.port}


def test_the_database_stopped_answers_503_in_time_and_the_next_request_after_it_returns_succeeds(
        gateways: tuple[RunningGateway, RunningGateway], database: tuple[PostgresServer, str]) -> None:
    server, url = database
    secret = create_key(url, "outage", "--rpm", "1000")
    assert all(chat(gw, secret).status_code == 200 for gw in gateways)
    server.stop()
    try:
        for gw in gateways:
            for route in ("/v1/chat/completions", "/admin/keys", "/admin/usage"):
                started = time.monotonic()
                if route == "/v1/chat/completions":
                    r = chat(gw, secret)
                else:
                    r = httpx.get(gw.url + route, headers=ADMIN, timeout=30)
                took = time.monotonic() - started
                assert r.status_code == 503, (route, r.status_code, r.text)
                assert took <= STORE_TIMEOUT_S + 1.0, (route, took)
                assert r.json()["error"]["code"] == "store_unavailable" and int(r.headers["retry-after"]) > 0
            assert httpx.get(gw.url + "/health", timeout=10).status_code == 200  # needs no database
            assert chat(gw, ADMIN_SECRET).status_code == 200  # the config file's key needs no store to authenticate
        down = enginegate(url.replace("eg@", "eg:pw-s3cret@"), "keys", "list")
        assert down.returncode == 1 and "127.0.0.1" in down.stderr and "pw-s3cret" not in down.stderr + down.stdout
        assert "Traceback" not in down.stderr
    finally:
        server.start()
    for gw in gateways:  # no restart: the very next request after the database is back is served
        r = chat(gw, secret)
        assert r.status_code == 200, r.text
        assert "Traceback" not in gw.log()


def test_a_key_cached_on_both_gateways_and_revoked_on_one_is_refused_by_the_others_next_request(
        gateways: tuple[RunningGateway, RunningGateway], database: tuple[PostgresServer, str]) -> None:
    """No key limits: nothing but the lookup cache and its push (LISTEN/NOTIFY) stands between the revoke and
    the other gateway; the revoke's NOTIFY is delivered before its reply, so the very next request is refused."""
    one, two = gateways
    _, url = database
    secret = create_key(url, "cached")
    for _ in range(3):
        assert all(chat(gw, secret).status_code == 200 for gw in gateways)  # cached on both now
    assert httpx.post(one.url + "/admin/keys/cached/revoke", headers=ADMIN, timeout=10).status_code == 200
    r = chat(two, secret)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_when_the_push_connection_dies_no_gateway_accepts_a_key_revoked_meanwhile(
        gateways: tuple[RunningGateway, RunningGateway], database: tuple[PostgresServer, str]) -> None:
    """The listening connections killed by the server: each gateway drops its cache and caches nothing until it
    listens again, so a key revoked while nobody listens is refused at once; the cache comes back after."""
    server, url = database
    for round_ in range(3):
        name = f"unpushed-{round_}"
        secret = create_key(url, name)
        assert all(chat(gw, secret).status_code == 200 for gw in gateways)
        killed = server.psql("enginegate", "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                             "WHERE application_name = 'enginegate-keys-watch') AS t")
        assert int(killed) == 2  # one listener per gateway
        assert enginegate(url, "keys", "revoke", name).returncode == 0  # nobody listening
        for gw in gateways:
            r = chat(gw, secret)
            assert r.status_code == 401, f"round {round_}: a key revoked while the push was down was accepted"
    deadline = time.monotonic() + REVOKE_WAIT_S  # the listeners come back by themselves
    while int(server.psql("enginegate", "SELECT count(*) FROM pg_stat_activity "
                          "WHERE application_name = 'enginegate-keys-watch'")) < 2:
        assert time.monotonic() < deadline, "the gateways did not listen again"
        time.sleep(0.1)
    for gw in gateways:
        assert "Traceback" not in gw.log()
