"""The client mistakes of issue 12 against the real gateway and the real in-process llama.cpp:
each is a 400 naming its param (streaming too: an error status, never a 200 with an error event),
never a 500 `engine_error`."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.gateway_process import RunningGateway

pytestmark = pytest.mark.integration

MODEL = "smollm2-135m-instruct"


def chat(**message: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", **message}]}


CASES = [
    ("/v1/chat/completions", chat(), "messages.0.content"),
    ("/v1/chat/completions", chat(content=None), "messages.0.content"),
    ("/v1/chat/completions", chat(content=[{}]), "messages.0.content"),
    ("/v1/chat/completions", {**chat(), "stream": True}, "messages.0.content"),
    ("/v1/completions", {"model": MODEL, "max_tokens": 2, "prompt": ""}, "prompt"),
    ("/v1/completions", {"model": MODEL, "max_tokens": 2, "prompt": [99999999]}, "prompt"),
    ("/v1/completions", {"model": MODEL, "max_tokens": 2, "prompt": [-5]}, "prompt"),
    ("/v1/completions", {"model": MODEL, "max_tokens": 2, "prompt": [99999999], "stream": True}, "prompt"),
    ("/v1/embeddings", {"model": MODEL, "input": ["", "x"]}, "input"),
    ("/v1/embeddings", {"model": MODEL, "input": [1, 2, 3]}, "input"),
    ("/v1/embeddings", {"model": MODEL, "input": [[1, 2, 3]]}, "input"),
    ("/v1/embeddings", {"model": MODEL, "input": [1.0, 2.0]}, "input"),
    ("/v1/embeddings", {"model": MODEL, "input": ["x", "\x16"]}, "input"),  # no token at all (found by the fuzzer)
    ("/v1/embeddings", {"model": MODEL, "input": "\x16"}, "input"),
]


@pytest.mark.parametrize("path, body, param", CASES)
def test_client_mistakes_are_400_with_param(gw: RunningGateway, path: str, body: dict[str, Any], param: str) -> None:
    r = httpx.post(gw.url + path, json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error


def test_valid_token_ids_still_work(gw: RunningGateway) -> None:
    r = httpx.post(gw.url + "/v1/completions", json={"model": MODEL, "max_tokens": 2, "prompt": [1, 2, 3]}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 3


def test_text_content_parts_are_served_and_other_parts_refused(gw: RunningGateway) -> None:
    parts = [{"type": "text", "text": "Say hi."}, {"type": "text", "text": "Briefly."}]
    ok = httpx.post(gw.url + "/v1/chat/completions", json=chat(content=parts), timeout=60)
    assert ok.status_code == 200, ok.text  # was a 500: the chat template concatenated a list
    image = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    refused = httpx.post(gw.url + "/v1/chat/completions", json=chat(content=image), timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "messages.0.content"


def test_an_assistant_tool_call_without_content_is_served(gw: RunningGateway) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    body = {"model": MODEL, "max_tokens": 2, "messages": [
        {"role": "user", "content": "Look it up."}, {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"}]}
    r = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text  # was a 500: the chat template concatenated None
