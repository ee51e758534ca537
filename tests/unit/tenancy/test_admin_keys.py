"""/admin/keys in process: an open gateway (no key anywhere) cannot be locked by a remote client
creating the first key; with an admin key, keys are made, listed without secrets and revoked."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.config import Settings
from gateway.runtime import runtime_for_adapters
from gateway.tenancy.keys import KeyPolicy
from tests.fakes import EchoAdapter

CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}


def client(tmp_path: Path, **settings: object) -> TestClient:
    s = Settings(tenancy={"path": tmp_path / "keys.sqlite3"}, **settings)  # type: ignore[arg-type]
    return TestClient(create_app(s, runtime_for_adapters(s, {"echo": EchoAdapter()})))


def test_an_open_gateway_refuses_to_make_its_first_key_remotely(tmp_path: Path) -> None:
    with client(tmp_path) as c:
        r = c.post("/admin/keys", json={"name": "intruder", "role": "admin"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "permission_denied"
        assert c.get("/admin/keys").json()["data"] == []
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200  # still open


def test_admin_makes_lists_and_revokes_keys(tmp_path: Path) -> None:
    admin = {"Authorization": "Bearer root-key"}
    with client(tmp_path, api_keys=({"key": "root-key", "role": "admin", "name": "root"},)) as c:
        made = c.post("/admin/keys", json={"name": "team-a", "models": ["echo"], "rpm": 2}, headers=admin)
        assert made.status_code == 200
        secret = made.json()["key"]
        assert c.post("/admin/keys", json={"name": "team-a"}, headers=admin).status_code == 409
        assert c.post("/admin/keys", json={"name": "root"}, headers=admin).status_code == 409
        assert c.post("/admin/keys", json={"name": "bad name"}, headers=admin).status_code == 400
        listed = c.get("/admin/keys", headers=admin).text
        assert secret not in listed and "root-key" not in listed and '"team-a"' in listed
        user = {"Authorization": f"Bearer {secret}"}
        assert c.get("/admin/keys", headers=user).status_code == 403
        assert c.post("/v1/chat/completions", json=CHAT, headers=user).headers["x-ratelimit-remaining-requests"] == "1"
        rotated = c.post("/admin/keys/team-a/rotate", headers=admin).json()["key"]
        assert c.post("/v1/chat/completions", json=CHAT, headers=user).status_code == 401
        again = c.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {rotated}"})
        assert again.status_code == 200 and again.headers["x-ratelimit-remaining-requests"] == "0"  # limits carry on
        assert c.post("/admin/keys/team-a/revoke", headers=admin).status_code == 200
        assert c.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {rotated}"}).status_code == 401
        assert c.post("/admin/keys/team-a/revoke", headers=admin).status_code == 404


def test_admin_resets_a_keys_slots_and_turns_auth_off_only_once_every_key_is_revoked(tmp_path: Path) -> None:
    import asyncio

    from gateway.tenancy.limits import Limits
    from gateway.tenancy.sqlite_store import SQLiteKeyStore

    admin = {"Authorization": "Bearer root-key"}
    with client(tmp_path, api_keys=({"key": "root-key", "role": "admin", "name": "root"},)) as c:
        made = c.post("/admin/keys", json={"name": "one-at-a-time", "max_concurrency": 1}, headers=admin).json()
        user = {"Authorization": f"Bearer {made['key']}"}

        async def hold() -> None:  # a gateway that died holding the key's only slot
            other = SQLiteKeyStore(tmp_path / "keys.sqlite3")
            assert (await other.reserve("one-at-a-time", Limits.of(KeyPolicy(max_concurrency=1), 0.0), 1, "dead")).admitted
            await other.close()

        asyncio.run(hold())
        assert c.post("/v1/chat/completions", json=CHAT, headers=user).status_code == 429
        assert c.post("/admin/keys/one-at-a-time/release-leases", headers=user).status_code == 403
        r = c.post("/admin/keys/one-at-a-time/release-leases", headers=admin)
        assert r.status_code == 200 and r.json() == {"name": "one-at-a-time", "released": 1}
        assert c.post("/v1/chat/completions", json=CHAT, headers=user).status_code == 200

        refused = c.post("/admin/auth/disable", headers=admin)
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "keys_active"
        assert c.post("/admin/keys/one-at-a-time/revoke", headers=admin).status_code == 200
        r = c.post("/admin/auth/disable", headers=admin)
        assert r.status_code == 200 and r.json() == {"auth_enabled": True, "config_keys": 1}  # the config's key still rules
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 401


def test_a_keyed_requests_measured_duration_does_not_wait_for_its_settle_write(tmp_path: Path) -> None:
    """The settle is written after the response by the writer task: a slow store write (here 0.5 s) is not part of
    the request's duration (enginegate_request_duration_seconds, the overhead histogram), and the usage still lands."""
    import asyncio

    from gateway.tenancy.store import Settlement

    key = {"key": "team-key", "name": "team", "rpm": 1000}
    with client(tmp_path, api_keys=(key,)) as c:
        store = c.app.state.tenancy.store  # type: ignore[attr-defined]
        write = store.settle

        async def slow_settle(settlements: list[Settlement]) -> None:
            await asyncio.sleep(0.5)
            await write(settlements)

        store.settle = slow_settle
        assert c.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer team-key"}).status_code == 200
        metrics = c.get("/metrics").text
        total = next(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                     if line.startswith("enginegate_request_duration_seconds_sum") and "/v1/chat/completions" in line)
        assert total < 0.5
    rows = asyncio.run(_usage(tmp_path))  # closing the app wrote it
    assert [r["requests"] for r in rows] == [1]


async def _usage(tmp_path: Path) -> list[dict[str, object]]:
    from gateway.tenancy.sqlite_store import SQLiteKeyStore

    store = SQLiteKeyStore(tmp_path / "keys.sqlite3")
    try:
        return await store.usage("team")
    finally:
        await store.close()


def test_a_keyed_streams_usage_is_what_the_engine_reported_not_the_estimate(tmp_path: Path) -> None:
    """The stream's usage reaches its ticket before the response's last message, which settles it: the usage
    ledger holds the engine's counts for a stream as for a JSON answer."""
    import asyncio

    key = {"key": "team-key", "name": "team", "rpm": 1000}
    auth = {"Authorization": "Bearer team-key"}
    with client(tmp_path, api_keys=(key,)) as c:
        answer = c.post("/v1/chat/completions", json=CHAT, headers=auth).json()["usage"]
        with c.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True,
                                                             "stream_options": {"include_usage": True}}, headers=auth) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: {")]
        streamed = [u for u in (__import__("json").loads(line[6:]).get("usage") for line in lines) if u]
    assert streamed and streamed[-1]["completion_tokens"] == answer["completion_tokens"]
    rows = asyncio.run(_usage(tmp_path))
    assert [r["requests"] for r in rows] == [2]
    assert rows[0]["completion_tokens"] == 2 * answer["completion_tokens"]
    assert rows[0]["prompt_tokens"] == 2 * answer["prompt_tokens"]
