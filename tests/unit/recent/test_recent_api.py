"""The recent-requests record and the response facts headers through the real app (a fake engine):
one row per API request with its replica, tokens, timings and finish reason; never the key or the
prompt; each key sees its own tenant's rows only, an admin all; the error shape for bad filters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.config import Settings
from gateway.runtime import runtime_for_adapters
from tests.fakes import EchoAdapter

PROMPT = "alpha beta gamma"
CHAT = {"model": "echo", "messages": [{"role": "user", "content": PROMPT}]}
ADMIN, A, B = "root-secret-1", "team-a-secret-2", "team-b-secret-3"
KEYS = ({"key": ADMIN, "role": "admin", "name": "root"}, {"key": A, "name": "team-a", "rpm": 50},
        {"key": B, "name": "team-b"})


def client(tmp_path: Path, **settings: Any) -> TestClient:
    s = Settings(tenancy={"path": tmp_path / "keys.sqlite3"}, **settings)
    return TestClient(create_app(s, runtime_for_adapters(s, {"echo": EchoAdapter()})))


def auth(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def test_one_row_per_request_streamed_or_not_with_the_facts_headers(tmp_path: Path) -> None:
    with client(tmp_path) as c:
        whole = c.post("/v1/chat/completions", json=CHAT)
        streamed = c.post("/v1/chat/completions", json={**CHAT, "stream": True})
        missing = c.post("/v1/chat/completions", json={**CHAT, "model": "no-such"})
        for r in (whole, streamed):
            assert r.headers["x-enginegate-engine"] == "echo" and r.headers["x-enginegate-replica"] == "0"
            assert float(r.headers["x-enginegate-queue-ms"]) >= 0
        assert "x-enginegate-engine" not in missing.headers  # refused before any replica was chosen
        rows = c.get("/admin/requests").json()
    assert [r["id"] for r in rows["data"]] == [h.headers["x-enginegate-request-id"] for h in (missing, streamed, whole)]
    bad, s, w = rows["data"]
    assert bad["status"] == 404 and bad["model"] is None and bad["engine"] is None and bad["queue_ms"] is None
    assert w["status"] == 200 and w["model"] == "echo" and w["engine"] == "echo" and w["stream"] is False
    assert (w["prompt_tokens"], w["completion_tokens"], w["finish_reason"]) == (3, 3, "stop")
    assert w["ttft_ms"] is None and w["total_ms"] > 0 and w["tenant"] is None
    assert s["stream"] is True and s["finish_reason"] == "stop" and s["completion_tokens"] == 3
    assert 0 < s["ttft_ms"] <= s["total_ms"] and s["prefill_ms"] <= s["ttft_ms"] and s["decode_ms"] >= 0
    assert set(w) == {"id", "created", "tenant", "model", "endpoint", "status", "engine", "replica", "stream",
                      "queue_ms", "ttft_ms", "prefill_ms", "decode_ms", "total_ms", "prompt_tokens",
                      "completion_tokens", "cached_tokens", "finish_reason", "trace_id"}
    assert w["endpoint"] == "/v1/chat/completions" and w["trace_id"] is None
    assert PROMPT.split()[0] not in str(rows)


def test_the_openai_client_reads_the_facts_headers_streamed_and_not(tmp_path: Path) -> None:
    with client(tmp_path) as c:
        oai = openai.OpenAI(base_url=str(c.base_url) + "/v1", api_key="none", http_client=c)
        raw = oai.chat.completions.with_raw_response.create(model="echo", messages=CHAT["messages"])
        assert raw.headers["x-enginegate-engine"] == "echo" and raw.parse().choices[0].finish_reason == "stop"
        with oai.chat.completions.with_streaming_response.create(model="echo", messages=CHAT["messages"],
                                                                 stream=True) as streamed:
            assert streamed.headers["x-enginegate-replica"] == "0"
            request_id = streamed.headers["x-enginegate-request-id"]
            assert "".join(ch.choices[0].delta.content or "" for ch in streamed.parse() if ch.choices).strip() == PROMPT
        row = c.get("/admin/requests", params={"id": request_id}).json()["data"]
        assert len(row) == 1 and row[0]["stream"] is True


def test_each_key_sees_its_own_tenant_and_an_admin_every_one(tmp_path: Path) -> None:
    with client(tmp_path, api_keys=KEYS) as c:
        a_id = c.post("/v1/chat/completions", json=CHAT, headers=auth(A)).headers["x-enginegate-request-id"]
        b_id = c.post("/v1/chat/completions", json=CHAT, headers=auth(B)).headers["x-enginegate-request-id"]
        c.post("/v1/chat/completions", json=CHAT, headers=auth("wrong"))  # 401: no tenant
        seen_by_a = c.get("/admin/requests", headers=auth(A)).json()["data"]
        assert [r["id"] for r in seen_by_a] == [a_id] and seen_by_a[0]["tenant"] == "team-a"
        for probe in ({"id": b_id}, {"tenant": "team-b"}, {"id": "no-such-id"}):  # none tells another's row apart
            assert c.get("/admin/requests", params=probe, headers=auth(A)).json()["data"] == []
        everything = c.get("/admin/requests", headers=auth(ADMIN)).json()["data"]
        assert [(r["tenant"], r["status"]) for r in everything] == [(None, 401), ("team-b", 200), ("team-a", 200)]
        assert c.get("/admin/requests").status_code == 401
        text = c.get("/admin/requests", headers=auth(ADMIN)).text
        assert all(secret not in text for secret in (ADMIN, A, B))
        assert c.get("/admin/limits", headers=auth(A)).status_code == 403
        limits = {row["tenant"]: row for row in c.get("/admin/limits", headers=auth(ADMIN)).json()["data"]}
        assert limits["team-a"]["limits"]["rpm"]["limit"] == 50 and limits["team-a"]["limits"]["rpm"]["used"] == 1
        assert limits["team-b"]["limits"]["rpm"] == {"limit": None, "used": None, "ratio": None, "resets_in_ms": None}


@pytest.mark.parametrize(("params", "param"), [({"limit": 0}, "limit"), ({"limit": 5000}, "limit"),
                                                ({"status": "oops"}, "status"), ({"id": "x" * 200}, "id")])
def test_bad_filters_answer_400_naming_the_param(tmp_path: Path, params: dict[str, Any], param: str) -> None:
    with client(tmp_path) as c:
        r = c.get("/admin/requests", params=params)
    assert r.status_code == 400 and r.json()["error"]["param"] == f"query.{param}"


def test_the_ring_keeps_its_configured_size(tmp_path: Path) -> None:
    with client(tmp_path, recent_requests=2) as c:
        for _ in range(3):
            c.post("/v1/chat/completions", json=CHAT)
        body = c.get("/admin/requests").json()
    assert len(body["data"]) == 2 and body["kept"] == 2 and body["trace_url"] is None


def test_trace_ui_url_must_hold_the_trace_id() -> None:
    with pytest.raises(ValueError, match="trace_id"):
        Settings(trace_ui_url="http://jaeger:16686/trace/")
    assert Settings(trace_ui_url="http://j:16686/trace/{trace_id}").trace_ui_url


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/completions", {"model": "echo", "prompt": PROMPT}),
    ("/v1/responses", {"model": "echo", "input": PROMPT}),
    ("/v1/messages", {"model": "echo", "max_tokens": 16, "messages": [{"role": "user", "content": PROMPT}]}),
])
@pytest.mark.parametrize("stream", [False, True])
def test_every_generation_api_carries_the_facts_and_is_recorded(tmp_path: Path, path: str, body: dict[str, Any],
                                                                 stream: bool) -> None:
    with client(tmp_path) as c:
        r = c.post(path, json={**body, "stream": stream})
        assert r.status_code == 200, r.text
        assert r.headers["x-enginegate-engine"] == "echo" and r.headers["x-enginegate-replica"] == "0"
        row = c.get("/admin/requests", params={"id": r.headers["x-enginegate-request-id"]}).json()["data"][0]
    assert row["endpoint"] == path and row["stream"] is stream and row["status"] == 200
    assert row["completion_tokens"] == 3 and row["finish_reason"] == "stop"


@pytest.mark.parametrize(("body", "reason"), [
    (b'{"choices":[{"index":0,"message":{"content":"x"},"finish_reason":"length"}]}', "length"),
    (b'{"choices":[{"finish_reason": "tool_calls"}]}', "tool_calls"),
    (b'{"choices":[{"finish_reason":null}]}', None),
    ({"choices": [{"finish_reason": "stop"}]}, "stop"),
    ({"status": "completed"}, "completed"),
    ({"choices": []}, None),
])
def test_finish_of_a_whole_answer(body: Any, reason: str | None) -> None:
    from gateway.recent import finish_of
    assert finish_of(body) == reason


def test_a_tenant_holds_at_most_eight_live_streams_and_the_ninth_is_its_own_429(tmp_path: Path) -> None:
    with client(tmp_path, api_keys=KEYS) as c:
        ring = c.app.state.recent  # type: ignore[attr-defined]
        held = [ring.subscribe(owner="team-a") for _ in range(8)]  # eight streams of team-a open
        refused = c.get("/admin/requests/stream", headers=auth(A))
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "too_many_streams"
        assert int(refused.headers["retry-after"]) >= 1
        assert ring.subscribers_of("team-b") == 0 and ring.subscribers == 8  # team-b's own count is untouched
        for sub in held:
            ring.unsubscribe(sub)
