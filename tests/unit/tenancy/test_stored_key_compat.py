"""Key records a newer gateway wrote (issue 32, item 7): an older gateway reading one with a policy field it
does not know answered every request of that key with a plain-text 500 (KeyPolicy forbids extra fields).
Now a real SQLite key store file holding such a record fails closed through the auth middleware (the unknown
field may be a restriction this gateway cannot enforce): a 401 in the API's shape, one warning, the admin API
still lists and revokes the key, and the field is kept when the record is rewritten.
Config-file keys still forbid unknown fields: a typo there fails start-up."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from gateway.app import create_app
from gateway.config import Settings
from gateway.runtime import runtime_for_adapters
from gateway.tenancy.keys import KeyPolicy, new_record
from gateway.tenancy.sqlite_store import SQLiteKeyStore
from tests.fakes import EchoAdapter

CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
FUTURE = {"max_tier": "flex", "allowed_networks": ["10.0.0.0/8"]}  # fields of a gateway not written yet


async def stored_key(path: Path, name: str, policy: KeyPolicy, **written_by_newer: Any) -> str:
    """Make the key with the real store, then give its record the fields a newer gateway would write."""
    store = SQLiteKeyStore(path)
    record, secret = new_record(name, policy)
    await store.create(record)
    await store.close()
    conn = sqlite3.connect(path)
    with conn:
        [(raw,)] = conn.execute("SELECT record FROM keys WHERE name = ?", (name,)).fetchall()
        data = orjson.loads(raw)
        data["policy"] = {**data["policy"], **written_by_newer}
        conn.execute("UPDATE keys SET record = ? WHERE name = ?", (orjson.dumps(data), name))
    conn.close()
    return secret


def stored_policy(path: Path, name: str) -> dict[str, Any]:
    conn = sqlite3.connect(path)
    try:
        [(raw,)] = conn.execute("SELECT record FROM keys WHERE name = ?", (name,)).fetchall()
    finally:
        conn.close()
    return orjson.loads(raw)["policy"]  # type: ignore[no-any-return]


def app(path: Path) -> TestClient:
    s = Settings(tenancy={"path": path}, api_keys=({"key": "admin-key", "role": "admin", "name": "ops"},))  # type: ignore[arg-type]
    return TestClient(create_app(s, runtime_for_adapters(s, {"echo": EchoAdapter()})))


async def test_a_newer_gateways_record_is_refused_in_the_apis_shape_and_kept(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "keys.sqlite3"
    secret = await stored_key(path, "team-a", KeyPolicy(rpm=2), **FUTURE)
    auth = {"Authorization": f"Bearer {secret}"}
    with caplog.at_level(logging.WARNING), app(path) as c:
        answers = [c.post("/v1/chat/completions", json=CHAT, headers=auth) for _ in range(3)]
        listed = c.get("/admin/keys", headers={"Authorization": "Bearer admin-key"}).json()["data"]
        revoked = c.post("/admin/keys/team-a/revoke", headers={"Authorization": "Bearer admin-key"})
        after = c.post("/v1/chat/completions", json=CHAT, headers=auth)
    assert [a.status_code for a in answers] == [401, 401, 401]  # never served without the restriction it may carry
    assert {a.json()["error"]["code"] for a in answers} == {"invalid_api_key"}
    assert "newer enginegate" in answers[0].json()["error"]["message"]
    warned = [r.getMessage() for r in caplog.records if "does not know" in r.getMessage()]
    assert len(warned) == 1 and "'team-a'" in warned[0] and "allowed_networks, max_tier" in warned[0]
    assert [k.get("unknown_fields") for k in listed if k["name"] == "team-a"] == [["allowed_networks", "max_tier"]]
    assert revoked.status_code == 200 and after.status_code == 401
    assert stored_policy(path, "team-a") == {"rpm": 2, **FUTURE}  # rewritten by this gateway, nothing lost


async def test_a_value_this_gateway_cannot_read_is_a_401_in_the_apis_shape(tmp_path: Path) -> None:
    path = tmp_path / "keys.sqlite3"
    secret = await stored_key(path, "team-b", KeyPolicy(), service_tier="scale")  # a tier a newer gateway adds
    with app(path) as c:
        r = c.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {secret}"})
        ready = c.get("/ready", headers={"Authorization": f"Bearer {secret}"})
    assert r.status_code == 401 and r.headers["content-type"] == "application/json"
    assert r.json()["error"]["code"] == "invalid_api_key" and "newer enginegate" in r.json()["error"]["message"]
    assert ready.status_code == 200  # a public route: the key is no error there


def test_a_config_file_key_with_an_unknown_field_still_fails_start_up() -> None:
    with pytest.raises(ValidationError, match="max_tier"):
        Settings(api_keys=({"key": "k", "name": "team-a", "max_tier": "flex"},))  # type: ignore[arg-type]


async def test_the_key_is_refused_by_authentication_itself_so_no_route_identifies_it(tmp_path: Path) -> None:
    """Public routes (/ready shows an admin more) identify a caller too: refusing only on protected routes
    would let an admin key with an unknown restriction be recognised as an admin there."""
    from gateway.tenancy.keys import UnreadableKey
    from gateway.tenancy.service import Tenancy

    path = tmp_path / "keys.sqlite3"
    secret = await stored_key(path, "ops-2", KeyPolicy(role="admin"), **FUTURE)
    tenancy = Tenancy(SQLiteKeyStore(path))
    try:
        with pytest.raises(UnreadableKey, match="allowed_networks, max_tier"):
            await tenancy.authenticate(secret.encode())
    finally:
        await tenancy.store.close()
