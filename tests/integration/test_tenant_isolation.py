"""What one tenant can learn of another and of the host (issue 32, items 1 and 7), on a real gateway serving
the embedded model, driven by the official openai client with three config keys: team-a and team-b (users)
and ops (admin).

Stored Responses belong to the tenant that made them: another tenant's id answers exactly as a missing id
does; admins reach every record; a file written before owners were recorded is migrated at start-up, its
records admins only. /v1/models shows a user key no host path; a 403 echoes at most 64 characters of the path."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.gateway_process import RunningGateway, gateway
from tests.unit.stores.test_sqlite_response_migration import old_file

pytestmark = pytest.mark.integration

MODEL = "smollm2-135m-instruct"
KEYS = {"team-a": "key-team-a", "team-b": "key-team-b", "ops": "key-ops"}
CONFIG = ("api_keys:\n  - {key: key-team-a, name: team-a}\n  - {key: key-team-b, name: team-b}\n"
          "  - {key: key-ops, name: ops, role: admin}\n")
MISSING = "resp_0123456789abcdef0123456789abcdef"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    path = tmp_path_factory.mktemp("store") / "responses.sqlite3"
    old_file(path, ["resp_before_owners"])  # what the gateway before this change left
    with gateway(config_yaml=CONFIG, env={"ENGINEGATE_RESPONSE_STORE__PATH": str(path)}) as running:
        yield running


def client(gw: RunningGateway, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=KEYS[tenant], max_retries=0, timeout=120)


def raw(gw: RunningGateway, tenant: str, method: str, path: str, **kw: object) -> httpx.Response:
    return httpx.request(method, gw.url + path, headers={"Authorization": f"Bearer {KEYS[tenant]}"}, timeout=120,
                         **kw)  # type: ignore[arg-type]


def same_as_missing(theirs: httpx.Response, missing: httpx.Response, their_id: str) -> None:
    """Byte for byte the answer for an id that does not exist (but for the id itself)."""
    assert theirs.status_code == missing.status_code
    assert theirs.content.replace(their_id.encode(), MISSING.encode()) == missing.content
    assert {k for k in theirs.headers if k != "content-length"} == {k for k in missing.headers if k != "content-length"}


def test_another_tenant_cannot_read_chain_or_delete_a_stored_response(gw: RunningGateway) -> None:
    a, b, ops = client(gw, "team-a"), client(gw, "team-b"), client(gw, "ops")
    first = a.responses.create(model=MODEL, input="team-a's secret: the vault code is 4711.", max_output_tokens=8)
    assert first.store is True

    with pytest.raises(openai.NotFoundError) as got:
        b.responses.retrieve(first.id)
    assert got.value.code == "not_found"
    same_as_missing(raw(gw, "team-b", "GET", f"/v1/responses/{first.id}"),
                    raw(gw, "team-b", "GET", f"/v1/responses/{MISSING}"), first.id)

    with pytest.raises(openai.NotFoundError):
        b.responses.input_items.list(first.id)
    same_as_missing(raw(gw, "team-b", "GET", f"/v1/responses/{first.id}/input_items"),
                    raw(gw, "team-b", "GET", f"/v1/responses/{MISSING}/input_items"), first.id)

    with pytest.raises(openai.BadRequestError) as chained:
        b.responses.create(model=MODEL, input="What was the code?", previous_response_id=first.id, max_output_tokens=8)
    assert chained.value.code == "previous_response_not_found"
    body = {"model": MODEL, "input": "What was the code?", "max_output_tokens": 8}
    same_as_missing(raw(gw, "team-b", "POST", "/v1/responses", json={**body, "previous_response_id": first.id}),
                    raw(gw, "team-b", "POST", "/v1/responses", json={**body, "previous_response_id": MISSING}),
                    first.id)

    with pytest.raises(openai.NotFoundError):
        b.responses.delete(first.id)
    same_as_missing(raw(gw, "team-b", "DELETE", f"/v1/responses/{first.id}"),
                    raw(gw, "team-b", "DELETE", f"/v1/responses/{MISSING}"), first.id)

    assert a.responses.retrieve(first.id).id == first.id  # still there for its owner
    items = a.responses.input_items.list(first.id).data
    assert "4711" in str(items[0].model_dump())
    own = a.responses.create(model=MODEL, input="And the code?", previous_response_id=first.id, max_output_tokens=8)
    assert own.previous_response_id == first.id
    assert own.usage is not None and first.usage is not None and own.usage.input_tokens > first.usage.input_tokens

    assert ops.responses.retrieve(first.id).id == first.id  # an admin reads every tenant's
    assert "4711" in str(ops.responses.input_items.list(first.id).data[0].model_dump())
    ops.responses.delete(own.id)
    with pytest.raises(openai.NotFoundError):
        a.responses.retrieve(own.id)


def test_records_from_before_owners_are_admins_only_after_the_upgrade(gw: RunningGateway) -> None:
    with pytest.raises(openai.NotFoundError):
        client(gw, "team-a").responses.retrieve("resp_before_owners")
    with pytest.raises(openai.NotFoundError):
        client(gw, "team-b").responses.delete("resp_before_owners")
    assert client(gw, "ops").responses.retrieve("resp_before_owners").id == "resp_before_owners"


def test_a_user_key_sees_no_host_path_in_the_model_list(gw: RunningGateway) -> None:
    user = client(gw, "team-a").models.list().data
    admin = client(gw, "ops").models.list().data
    [path] = {m.model_extra["meta"]["path"] for m in admin if m.id == MODEL}  # type: ignore[index]
    assert path.startswith("/") and path.endswith(".gguf")
    for card in [*user, client(gw, "team-a").models.retrieve(MODEL)]:
        assert card.model_extra is not None
        assert "path" not in card.model_extra["meta"] and path not in str(card.model_dump())
        assert card.model_extra["meta"]["context_length"] > 0


def test_a_403_echoes_at_most_64_characters_of_the_path(gw: RunningGateway) -> None:
    path = "/admin/engines/" + "x" * 20_000
    r = raw(gw, "team-a", "GET", path)
    assert r.status_code == 403 and r.json()["error"]["code"] == "permission_denied"
    message = r.json()["error"]["message"]
    assert message == f"{path[:64]}... needs a key with role admin." and len(r.content) < 400
