"""API layer against a fake adapter: OpenAI error shapes, status codes and permissive parsing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.config import Settings
from gateway.runtime import runtime_for_adapters
from tests.fakes import EchoAdapter

CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hello there world"}]}


def make_client(adapter: EchoAdapter | None = None, **settings: object) -> TestClient:
    s = Settings(**settings)  # type: ignore[arg-type]
    app = create_app(s, runtime_for_adapters(s, {"echo": adapter or EchoAdapter()}, max_queue=int(settings.get("max_queue", 4))))  # type: ignore[call-overload]
    return TestClient(app)


@pytest.fixture
def client() -> Iterator[TestClient]:
    with make_client() as c:
        yield c


def assert_openai_error(response, status: int, err_type: str) -> dict:  # type: ignore[no-untyped-def]
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == err_type
    assert "Traceback" not in response.text
    return body["error"]


def test_chat_ok_and_unknown_fields_are_ignored(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json={**CHAT, "some_future_field": {"x": 1}, "user": "u1"})
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"] == "hello there world"
    assert r.headers["x-request-id"]


def test_invalid_json_is_400(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert_openai_error(r, 400, "invalid_request_error")


def test_schema_error_is_400_not_422_and_names_the_param(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json={"model": "echo", "messages": "hi"})
    err = assert_openai_error(r, 400, "invalid_request_error")
    assert err["param"].startswith("messages")


@pytest.mark.parametrize(
    "patch, param",
    [
        ({"messages": []}, "messages"),
        ({"temperature": 7}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
    ],
)
def test_bad_fields_are_400(client: TestClient, patch: dict, param: str) -> None:
    r = client.post("/v1/chat/completions", json={**CHAT, **patch})
    err = assert_openai_error(r, 400, "invalid_request_error")
    assert err["param"].startswith(param)


def test_body_must_be_an_object(client: TestClient) -> None:
    assert_openai_error(client.post("/v1/chat/completions", json=[1, 2]), 400, "invalid_request_error")


def test_unknown_model_is_404_model_not_found(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json={**CHAT, "model": "nope"})
    err = assert_openai_error(r, 404, "not_found_error")
    assert err["code"] == "model_not_found"
    assert_openai_error(client.get("/v1/models/nope"), 404, "not_found_error")


def test_n_out_of_range_is_refused_clearly(client: TestClient) -> None:
    err = assert_openai_error(client.post("/v1/chat/completions", json={**CHAT, "n": 129}), 400, "invalid_request_error")
    assert err["param"] == "n"


@pytest.mark.parametrize("route, extra, param", [
    ("/v1/chat/completions", {"logprobs": True}, "logprobs"),
    ("/v1/completions", {"logprobs": 1}, "logprobs"),
])
def test_logprobs_from_an_engine_without_them_is_a_clear_400(
    client: TestClient, route: str, extra: dict, param: str
) -> None:
    body = {**CHAT, **extra} if route.endswith("chat/completions") else {"model": "echo", "prompt": "hi", **extra}
    err = assert_openai_error(client.post(route, json=body), 400, "invalid_request_error")
    assert err["param"] == param and "echo" in err["message"]
    assert err["code"] == "unsupported_parameter"  # the error reference's code (it was null)


def test_max_tokens_0_needs_echo(client: TestClient) -> None:
    r = client.post("/v1/completions", json={"model": "echo", "prompt": "hi", "max_tokens": 0})
    err = assert_openai_error(r, 400, "invalid_request_error")
    assert "echo" in err["message"]


def test_unsupported_operation_is_400(client: TestClient) -> None:
    r = client.post("/v1/embeddings", json={"model": "echo", "input": "x"})
    assert_openai_error(r, 400, "invalid_request_error")


def test_unknown_route_is_openai_shaped_404(client: TestClient) -> None:
    assert_openai_error(client.get("/v1/nothing-here"), 404, "not_found_error")


def test_body_over_limit_is_413() -> None:
    with make_client(max_body_bytes=2048) as c:
        r = c.post("/v1/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]})
        assert_openai_error(r, 413, "invalid_request_error")


def test_body_over_limit_without_content_length_is_413() -> None:
    with make_client(max_body_bytes=2048) as c:
        def chunks() -> Iterator[bytes]:
            yield b'{"model": "echo", "messages": [{"role": "user", "content": "'
            yield b"x" * 4096
            yield b'"}]}'
        r = c.post("/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"})
        assert_openai_error(r, 413, "invalid_request_error")


def test_api_key_required_when_configured() -> None:
    with make_client(api_keys=("secret",)) as c:
        assert_openai_error(c.post("/v1/chat/completions", json=CHAT), 401, "authentication_error")
        bad = c.post("/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer wrong"})
        assert_openai_error(bad, 401, "authentication_error")
        ok = c.post("/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer secret"})
        assert ok.status_code == 200
        assert c.get("/health").status_code == 200  # health stays open for probes


def test_engine_error_mid_stream_becomes_an_error_event_and_closes() -> None:
    with make_client(EchoAdapter(fail_after=1)) as c:
        with c.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
            assert r.status_code == 200
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert '"error"' in events[-1]
        assert "engine died" in events[-1]
        assert events[-1] != "data: [DONE]"


def test_queue_full_is_429_with_retry_after() -> None:
    gate = asyncio.Event()
    adapter = EchoAdapter(gate=gate)
    s = Settings(retry_after_seconds=3)
    app = create_app(s, runtime_for_adapters(s, {"echo": adapter}, max_queue=0))
    with TestClient(app) as c:
        portal = c.portal  # type: ignore[attr-defined]
        assert portal is not None
        # Hold the only slot with a request that waits on the gate, from another thread.
        import threading

        first: dict = {}
        t = threading.Thread(target=lambda: first.setdefault("r", c.post("/v1/chat/completions", json=CHAT)))
        t.start()
        for _ in range(200):
            if adapter.seen_bodies:
                break
            threading.Event().wait(0.01)
        r = c.post("/v1/chat/completions", json=CHAT)
        err = assert_openai_error(r, 429, "rate_limit_error")
        assert err["code"] == "queue_full"
        assert r.headers["retry-after"] == "3"
        portal.call(gate.set)
        t.join()
        assert first["r"].status_code == 200


@pytest.mark.parametrize("field, value", [("repeat_penalty", [{}]), ("top_k", "forty"), ("min_p", 2.0),
                                          ("mirostat_mode", 7), ("typical_p", {"a": 1})])
def test_llamacpp_sampling_extras_of_the_wrong_type_are_the_clients_400(client: TestClient, field: str, value: object) -> None:
    """Found by the schema fuzz: `repeat_penalty: [{}]` reached llama-cpp-python, whose ctypes call failed
    (500 engine_error). The extras are typed in the request model now, on chat and completions."""
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", {"model": "echo", "prompt": "hi"})):
        err = assert_openai_error(client.post(path, json={**body, field: value}), 400, "invalid_request_error")
        assert err["param"] == field
