"""Logprobs, prompt scoring (echo) and the tokenizer routes against a real gateway serving the embedded
model: in-process llama.cpp with `scoring: true`, the same without it, and llama-server.
The scores are checked against llama-cpp-python's own logits for the same tokens."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from adapters.llama_server import find_llama_server
from gateway.modelsource import embedded_model_path
from tests.conformance.openai_spec import check
from tests.gateway_process import RunningGateway, gateway

pytestmark = pytest.mark.integration

SCORING = "smol-scoring"
PLAIN = "smol-plain"
SERVER = "smol-server"
USER = "sk-scoring-user-only-plain"
ANY = "sk-scoring-every-model"
CONTEXT = 512


def _config(root: Path) -> str:
    weights = str(embedded_model_path())
    models: list[dict[str, Any]] = [
        {"source": weights, "name": SCORING, "engine": "llamacpp", "threads": 2, "context_length": CONTEXT,
         "embeddings": False, "options": {"scoring": True}},
        {"source": weights, "name": PLAIN, "engine": "llamacpp", "threads": 1, "context_length": CONTEXT, "embeddings": False},
    ]
    if find_llama_server(None) is not None:
        models.append({"source": weights, "name": SERVER, "engine": "llama_server", "threads": 1,
                       "context_length": CONTEXT, "embeddings": False, "options": {"log_dir": str(root / "logs")}})
    keys = [{"key": USER, "models": [PLAIN]}, {"key": ANY}]
    return yaml.safe_dump({"models": models, "api_keys": keys})


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    root = tmp_path_factory.mktemp("scoring")
    with gateway(config_yaml=_config(root), env={"XDG_DATA_HOME": str(root / "data")}) as running:
        yield running


def post(gw: RunningGateway, path: str, body: dict[str, Any], status: int = 200, key: str = ANY) -> dict[str, Any]:
    r = httpx.post(gw.url + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=300)
    assert r.status_code == status, r.text
    return r.json()  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def reference() -> Any:
    """llama-cpp-python itself, every position's logits kept: the scores the gateway must reproduce."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(embedded_model_path()), n_ctx=CONTEXT, n_threads=1, logits_all=True, verbose=False)
    yield llm
    llm.close()


def _reference_logprobs(llm: Any, tokens: list[int]) -> list[float]:
    llm.reset()
    llm.eval(tokens)
    logits = np.asarray(llm.scores[: len(tokens)], dtype=np.float64)
    out = []
    for i in range(1, len(tokens)):
        row = logits[i - 1]
        out.append(float(row[tokens[i]] - (row.max() + math.log(np.exp(row - row.max()).sum()))))
    return out


def test_echo_scores_the_prompt_as_llama_cpp_does(gw: RunningGateway, reference: Any) -> None:
    text = "The capital of France is Paris"
    tokens = post(gw, "/tokenize", {"model": SCORING, "prompt": text, "add_special_tokens": False})["tokens"]
    want = _reference_logprobs(reference, tokens)
    for prompt in (text, tokens):
        body = post(gw, "/v1/completions", {"model": SCORING, "prompt": prompt, "echo": True, "logprobs": 1,
                                            "max_tokens": 0})
        check("CreateCompletionResponse", body)
        lp = body["choices"][0]["logprobs"]
        assert body["choices"][0]["text"] == text
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert len(lp["token_logprobs"]) == len(tokens) and body["usage"]["completion_tokens"] == 0
        assert np.allclose(lp["token_logprobs"][1:], want, atol=1e-3)
        assert "".join(lp["tokens"]) == text and lp["text_offset"][0] == 0
    # max_tokens 1 (lm-eval's request): the prompt's scores, then the one generated token's
    one = post(gw, "/v1/completions", {"model": SCORING, "prompt": tokens, "echo": True, "logprobs": 1,
                                       "max_tokens": 1, "temperature": 0})
    lp = one["choices"][0]["logprobs"]
    assert len(lp["token_logprobs"]) == len(tokens) + 1
    assert np.allclose(lp["token_logprobs"][1:-1], want, atol=1e-3)


def test_chat_logprobs_answer_openais_shape(gw: RunningGateway) -> None:
    models = [SCORING, PLAIN] + ([SERVER] if find_llama_server(None) else [])
    for model in models:
        body = post(gw, "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "Say hi"}],
                                                 "max_tokens": 6, "logprobs": True, "top_logprobs": 3, "temperature": 0})
        check("CreateChatCompletionResponse", body)
        content = body["choices"][0]["logprobs"]["content"]
        assert content and all(len(e["top_logprobs"]) == 3 and e["logprob"] <= 0 for e in content), (model, content)
        assert all(e["top_logprobs"][0]["logprob"] >= e["logprob"] - 1e-6 for e in content)
        assert "".join(e["token"] for e in content) == body["choices"][0]["message"]["content"], model


def test_completion_logprobs_legacy_shape_whole_and_streamed(gw: RunningGateway) -> None:
    models = [PLAIN] + ([SERVER] if find_llama_server(None) else [])
    for model in models:
        req = {"model": model, "prompt": "Once upon a time", "max_tokens": 5, "logprobs": 2, "temperature": 0}
        body = post(gw, "/v1/completions", req)
        check("CreateCompletionResponse", body)
        lp = body["choices"][0]["logprobs"]
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) > 0
        assert "".join(lp["tokens"]) == body["choices"][0]["text"], model
        assert all(len(top) >= 1 and max(top.values()) >= chosen - 1e-6
                   for top, chosen in zip(lp["top_logprobs"], lp["token_logprobs"], strict=True))
        with httpx.stream("POST", gw.url + "/v1/completions", json={**req, "stream": True}, timeout=300,
                          headers={"Authorization": f"Bearer {ANY}"}) as r:
            assert r.status_code == 200
            lines = [line[6:] for line in r.iter_lines() if line.startswith("data: {")]
        import json

        streamed = [t for line in lines for c in json.loads(line)["choices"] for t in ((c.get("logprobs") or {}).get("tokens") or [])]
        assert "".join(streamed) == body["choices"][0]["text"], model


def test_scoring_where_the_engine_cannot_is_a_400_naming_the_one_that_can(gw: RunningGateway) -> None:
    err = post(gw, "/v1/completions", {"model": PLAIN, "prompt": "Hi there", "echo": True, "logprobs": 1,
                                       "max_tokens": 0}, status=400)["error"]
    assert err["code"] == "unsupported_parameter" and err["param"] == "echo" and "scoring: true" in err["message"]
    if find_llama_server(None):
        err = post(gw, "/v1/completions", {"model": SERVER, "prompt": "Hi", "echo": True, "logprobs": 1,
                                           "max_tokens": 1}, status=400)["error"]
        assert err["code"] == "unsupported_parameter" and err["param"] == "echo" and "llamacpp" in err["message"]
    err = post(gw, "/v1/completions", {"model": SCORING, "prompt": "Hi", "max_tokens": 0}, status=400)["error"]
    assert "echo" in err["message"]


def test_tokenize_detokenize_and_tokenizer_info(gw: RunningGateway, reference: Any) -> None:
    text = "Hello world, tokens!"
    body = post(gw, "/tokenize", {"model": SCORING, "prompt": text})
    assert body["tokens"] == reference.tokenize(text.encode(), add_bos=True, special=True)
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == CONTEXT
    assert post(gw, "/detokenize", {"model": SCORING, "tokens": body["tokens"]})["prompt"].endswith(text)
    chat = post(gw, "/tokenize", {"model": SCORING, "messages": [{"role": "user", "content": text}]})
    assert chat["count"] > body["count"]
    info = httpx.get(gw.url + "/tokenizer_info", params={"model": SCORING}, timeout=60,
                     headers={"Authorization": f"Bearer {ANY}"}).json()
    assert info["eos_token"] and info["chat_template"]
    if find_llama_server(None):
        served = post(gw, "/tokenize", {"model": SERVER, "prompt": text, "add_special_tokens": False})
        assert served["tokens"] == reference.tokenize(text.encode(), add_bos=False, special=True)
        assert post(gw, "/detokenize", {"model": SERVER, "tokens": served["tokens"]})["prompt"] == text


def test_tokenize_keeps_the_keys_model_list(gw: RunningGateway) -> None:
    """A key limited to one model cannot tokenize with another (the chat path's 404), and, naming none, gets its own."""
    r = httpx.post(gw.url + "/tokenize", json={"model": SCORING, "prompt": "x"}, timeout=60)
    assert r.status_code == 401
    denied = post(gw, "/tokenize", {"model": SCORING, "prompt": "x"}, status=404, key=USER)["error"]
    chat = post(gw, "/v1/chat/completions", {"model": SCORING, "messages": [{"role": "user", "content": "x"}]},
                status=404, key=USER)["error"]
    assert denied["code"] == chat["code"] == "model_not_found" and SCORING not in denied["message"].split("served here:")[1]
    assert post(gw, "/tokenize", {"prompt": "x y"}, key=USER)["count"] >= 2
    assert post(gw, "/detokenize", {"tokens": [-1]}, status=400, key=USER)["error"]["param"] == "tokens"
