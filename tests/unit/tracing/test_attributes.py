"""Span attributes from requests, usage and responses: a table."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from adapters.base import Usage
from gateway.tracing import attributes as attrs

BASE = {"gen_ai.provider.name": "vllm", "gen_ai.system": "vllm", "gen_ai.request.model": "m"}


@pytest.mark.parametrize(("operation", "body", "expected"), [
    ("chat", {}, {"gen_ai.operation.name": "chat"}),
    ("completions", {}, {"gen_ai.operation.name": "text_completion"}),
    ("embeddings", {}, {"gen_ai.operation.name": "embeddings"}),
    ("responses", {}, {"gen_ai.operation.name": "chat"}),
    ("chat", {"temperature": 0, "top_p": 0.5, "max_tokens": 9, "seed": 3, "n": 2, "stream": True,
              "frequency_penalty": 0.1, "presence_penalty": -0.2, "top_k": 40},
     {"gen_ai.operation.name": "chat", "gen_ai.request.temperature": 0, "gen_ai.request.top_p": 0.5,
      "gen_ai.request.max_tokens": 9, "gen_ai.request.seed": 3, "gen_ai.request.choice.count": 2, "enginegate.stream": True,
      "gen_ai.request.frequency_penalty": 0.1, "gen_ai.request.presence_penalty": -0.2, "gen_ai.request.top_k": 40}),
    ("chat", {"max_completion_tokens": 5, "max_tokens": 7}, {"gen_ai.operation.name": "chat", "gen_ai.request.max_tokens": 5}),
    ("chat", {"temperature": "hot", "max_tokens": True, "seed": 1.5, "stream": "yes"}, {"gen_ai.operation.name": "chat"}),
    ("chat", {"stop": "END"}, {"gen_ai.operation.name": "chat", "gen_ai.request.stop_sequences": ("END",)}),
    ("chat", {"stop": ["a", "b"]}, {"gen_ai.operation.name": "chat", "gen_ai.request.stop_sequences": ("a", "b")}),
    ("chat", {"stop": ["a", 1]}, {"gen_ai.operation.name": "chat"}),
    ("chat", {"stop": []}, {"gen_ai.operation.name": "chat"}),
    ("chat", {"stop": [str(i) * 100 for i in range(9)]},  # a client's text: four at most, each cut short
     {"gen_ai.operation.name": "chat", "gen_ai.request.stop_sequences": tuple(str(i) * 64 for i in range(4))}),
    ("chat", {"messages": [{"role": "user", "content": "secret"}], "user": "u"}, {"gen_ai.operation.name": "chat"}),
])
def test_request_attributes(operation: str, body: dict[str, Any], expected: dict[str, Any]) -> None:
    assert attrs.request_attributes(operation, "vllm", "m", body) == {**BASE, **expected}


@pytest.mark.parametrize(("usage", "expected"), [
    (None, {}),
    (Usage(3, 4), {"gen_ai.usage.input_tokens": 3, "gen_ai.usage.output_tokens": 4}),
    (Usage(3, 4, cached_tokens=2, prefill_seconds=0.0125),
     {"gen_ai.usage.input_tokens": 3, "gen_ai.usage.output_tokens": 4, "gen_ai.usage.cache_read.input_tokens": 2,
      "enginegate.engine.prefill_ms": 12.5}),
])
def test_usage_attributes(usage: Usage | None, expected: dict[str, Any]) -> None:
    assert attrs.usage_attributes(usage) == expected


RESPONSE = {"id": "chatcmpl-1", "model": "smol-q4", "choices": [
    {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}},
    {"index": 1, "finish_reason": "length", "message": {"role": "assistant", "content": "h"}}]}


@pytest.mark.parametrize(("body", "expected"), [
    (RESPONSE, {"gen_ai.response.id": "chatcmpl-1", "gen_ai.response.model": "smol-q4",
                "gen_ai.response.finish_reasons": ("stop", "length")}),
    (orjson.dumps(RESPONSE), {"gen_ai.response.id": "chatcmpl-1", "gen_ai.response.model": "smol-q4",
                              "gen_ai.response.finish_reasons": ("stop", "length")}),
    (b"not json", {}),
    (b"[1]", {}),
    ({"choices": [{"finish_reason": None}, "x"]}, {}),
    (None, {}),
])
def test_response_attributes(body: Any, expected: dict[str, Any]) -> None:
    assert attrs.response_attributes(body) == expected


def test_content_only_as_json_of_the_messages() -> None:
    assert attrs.input_messages({"messages": [{"role": "user", "content": "hi"}]}) == '[{"role":"user","content":"hi"}]'
    assert attrs.input_messages({"prompt": "p"}) == '"p"'
    assert attrs.output_messages(orjson.dumps(RESPONSE)) == orjson.dumps(
        [c["message"] for c in RESPONSE["choices"]]).decode()  # type: ignore[index]
    assert attrs.output_messages(b"{}") is None


def test_http_attributes_hold_no_header_but_the_user_agent() -> None:
    scope = {"method": "POST", "path": "/v1/chat/completions", "scheme": "http", "server": ("127.0.0.1", 8000),
             "client": ("10.0.0.9", 5555), "headers": [(b"authorization", b"Bearer sk-secret"), (b"user-agent", b"openai/1")]}
    got = attrs.http_server_attributes(scope)
    assert got == {"http.request.method": "POST", "url.path": "/v1/chat/completions", "url.scheme": "http",
                   "server.address": "127.0.0.1", "server.port": 8000, "client.address": "10.0.0.9",
                   "user_agent.original": "openai/1"}


@pytest.mark.parametrize(("scope", "route"), [
    ({"path": "/v1/chat/completions"}, "/v1/chat/completions"),
    ({"path": "/v1/responses/abc"}, None),
    ({"path": "/v1/responses/abc", "route": type("R", (), {"path": "/v1/responses/{response_id}"})()},
     "/v1/responses/{response_id}"),
])
def test_route_of(scope: dict[str, Any], route: str | None) -> None:
    assert attrs.route_of(scope, frozenset({"/v1/chat/completions"})) == route
