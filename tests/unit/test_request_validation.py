"""Client mistakes are 400s naming the param, caught before the engine sees them; the engine gets
the validated request, not the raw body."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from adapters.base import Capabilities, Completion, RequestContext, Usage
from gateway.app import create_app
from gateway.config import Settings
from gateway.runtime import runtime_for_adapters
from tests.fakes import EchoAdapter


class VocabEcho(EchoAdapter):
    """An echo engine that reports a 100-token vocabulary and a 50-token context."""

    capabilities = Capabilities(chat=True, completions=True, embeddings=True)

    def describe(self) -> dict[str, Any]:
        return {"vocab_size": 100, "context_length": 50}

    async def embeddings(self, body: dict[str, Any], ctx: RequestContext) -> Completion:
        self.seen_bodies.append(body)
        return Completion(body={"object": "list", "data": [], "model": ctx.model}, usage=Usage())


@pytest.fixture
def engine() -> VocabEcho:
    return VocabEcho()


@pytest.fixture
def client(engine: VocabEcho) -> Iterator[TestClient]:
    settings = Settings()
    with TestClient(create_app(settings, runtime_for_adapters(settings, {"echo": engine}))) as c:
        yield c


def user(content: Any = ..., **extra: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "user", **extra}
    if content is not ...:
        message["content"] = content
    return message


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", {"messages": [user()]}, "messages.0.content"),
    ("/v1/chat/completions", {"messages": [user(None)]}, "messages.0.content"),
    ("/v1/chat/completions", {"messages": [user([{}])]}, "messages.0.content"),
    ("/v1/chat/completions", {"messages": [user([])]}, "messages.0.content"),
    ("/v1/chat/completions", {"messages": [user([{"type": "text"}])]}, "messages.0.content"),
    ("/v1/chat/completions", {"messages": [{"role": "assistant"}]}, "messages.0.content"),
    ("/v1/completions", {"prompt": ""}, "prompt"),
    ("/v1/completions", {"prompt": ["a", ""]}, "prompt"),
    ("/v1/completions", {"prompt": [99999999]}, "prompt"),
    ("/v1/completions", {"prompt": [-5]}, "prompt"),
    ("/v1/completions", {"prompt": [[1, 2], []]}, "prompt"),
    ("/v1/completions", {"prompt": [1.0, 2.0]}, "prompt"),
    ("/v1/completions", {"prompt": [True]}, "prompt"),
    ("/v1/completions", {"prompt": list(range(50))}, "prompt"),  # the whole context, no room to answer
    ("/v1/embeddings", {"input": ["", "x"]}, "input"),
    ("/v1/embeddings", {"input": [1.0, 2.0]}, "input"),
    ("/v1/embeddings", {"input": [[1, 2, 300]]}, "input"),
    ("/v1/embeddings", {"input": [-1]}, "input"),
    ("/v1/embeddings", {"input": ""}, "input"),
    # issue 21: ranges against the model's own limits, content the engine cannot take
    ("/v1/chat/completions", {"messages": [user("q")], "max_tokens": 51}, "max_tokens"),  # over the 50-token context
    ("/v1/chat/completions", {"messages": [user("q")], "max_tokens": 51, "stream": True}, "max_tokens"),
    ("/v1/chat/completions", {"messages": [user("q")], "max_completion_tokens": 10**12}, "max_completion_tokens"),
    ("/v1/completions", {"prompt": "q", "max_tokens": 4294967295}, "max_tokens"),  # wraps to -1 in a 32-bit engine
    ("/v1/responses", {"input": "q", "max_output_tokens": 51}, "max_tokens"),
    ("/v1/responses", {"input": ""}, "input"),
    ("/v1/responses", {"input": "", "stream": True}, "input"),
    ("/v1/chat/completions", {"messages": [user([{"type": "image_url", "image_url": {"url": "data:,"}}])]},
     "messages.0.content"),
    ("/v1/chat/completions", {"messages": [user("q"), user([{"type": "input_audio", "input_audio": {"data": ""}}])]},
     "messages.1.content"),
    ("/v1/messages", {"max_tokens": 2, "messages": [user([{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "AAAA"}}])]}, None),
    ("/v1/responses", {"input": [user([{"type": "input_image", "image_url": "data:,"}])]}, "input"),
])
def test_client_mistakes_are_400_with_param_and_never_reach_the_engine(
    client: TestClient, engine: VocabEcho, path: str, body: dict[str, Any], param: str
) -> None:
    r = client.post(path, json={"model": "echo", **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    if path == "/v1/messages":  # Anthropic's error shape: no param
        assert error["type"] == "invalid_request_error" and "image input" in error["message"], error
    else:
        assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert engine.seen_bodies == []


def test_the_engine_gets_the_validated_request(client: TestClient, engine: VocabEcho) -> None:
    r = client.post("/v1/chat/completions", json={
        "model": "echo", "messages": [user("hello")], "temperature": "0.5", "max_tokens": 3.0, "vendor_field": {"k": 1},
    })
    assert r.status_code == 200, r.text
    (seen,) = engine.seen_bodies
    assert seen["temperature"] == 0.5 and seen["max_tokens"] == 3 and isinstance(seen["max_tokens"], int)
    assert seen["vendor_field"] == {"k": 1}  # unknown fields still pass through
    assert "stream" not in seen and "tool_calls" not in seen["messages"][0]  # nothing the client did not send


def test_valid_inputs_pass(client: TestClient, engine: VocabEcho) -> None:
    tool_call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    ok = [
        ("/v1/chat/completions", {"messages": [user("q"), {"role": "assistant", "tool_calls": [tool_call]},
                                               {"role": "tool", "tool_call_id": "c1", "content": "42"}]}),
        ("/v1/chat/completions", {"messages": [user([{"type": "text", "text": "hi"}])]}),
        ("/v1/completions", {"prompt": [1, 2, 99]}),
        ("/v1/completions", {"prompt": ["a", "b"]}),
        ("/v1/embeddings", {"input": [[1, 2, 3], [4]]}),
        ("/v1/embeddings", {"input": ["x", "y"]}),
    ]
    for path, body in ok:
        r = client.post(path, json={"model": "echo", **body})
        assert r.status_code == 200, (body, r.text)
    assert len(engine.seen_bodies) == len(ok)
