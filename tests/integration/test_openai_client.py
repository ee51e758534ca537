"""The real gateway serving the embedded model, driven by the official openai client."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import orjson
import pytest

from tests.gateway_process import RunningGateway
from tests.model_facts import embedding_length

pytestmark = pytest.mark.integration

MODEL = "smollm2-135m-instruct"
HELLO = [{"role": "user", "content": "Say hello in five words."}]


@pytest.fixture(scope="module")
def client(gw: RunningGateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=120)


def test_chat_non_stream(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=16, temperature=0)
    assert r.object == "chat.completion"
    assert r.model == MODEL
    assert r.id and r.created > 0
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content
    assert r.choices[0].finish_reason in {"stop", "length"}
    assert r.usage is not None and r.usage.prompt_tokens > 5
    assert 0 < r.usage.completion_tokens <= 16
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_max_completion_tokens_limits_output(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=HELLO, max_completion_tokens=3, temperature=0)
    assert r.usage is not None and r.usage.completion_tokens <= 3


def test_chat_stream_order_and_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=12, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert content_chunks
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and chunks.index(finish[0]) == len(chunks) - 2
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert 0 < usage_chunk.usage.completion_tokens <= 12
    assert usage_chunk.usage.prompt_tokens > 5
    assert all(c.model == MODEL and c.id == chunks[0].id for c in chunks)


def test_stream_same_text_as_non_stream_at_temperature_zero(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=10, temperature=0, seed=1)
    parts = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=10, temperature=0, seed=1, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
    assert streamed == whole.choices[0].message.content


def test_raw_sse_framing_ends_with_done(gw: RunningGateway) -> None:
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", gw.base_url + "/chat/completions", json=body, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    blocks = [b for b in raw.split("\n\n") if b]
    assert all(b.startswith("data: ") for b in blocks)
    assert blocks[-1] == "data: [DONE]"
    assert "usage" not in blocks[-2]  # not asked for: not sent


def test_completions_string_and_list(client: openai.OpenAI) -> None:
    one = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=5, temperature=0)
    assert one.object == "text_completion" and one.choices[0].text
    assert one.usage is not None and one.usage.completion_tokens <= 5
    many = client.completions.create(model=MODEL, prompt=["1, 2, 3,", "a, b, c,"], max_tokens=4, temperature=0)
    assert [c.index for c in many.choices] == [0, 1]
    assert many.usage is not None and many.usage.prompt_tokens > one.usage.prompt_tokens


def test_completions_stream(client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= 6


def test_embeddings_have_the_models_width(client: openai.OpenAI) -> None:
    width = embedding_length()
    r = client.embeddings.create(model=MODEL, input=["hello world", "goodbye"])  # client asks for base64
    assert [d.index for d in r.data] == [0, 1]
    assert all(len(d.embedding) == width for d in r.data)
    assert r.data[0].embedding != r.data[1].embedding
    assert r.usage.prompt_tokens > 0
    floats = client.embeddings.create(model=MODEL, input="hello world", encoding_format="float")
    assert floats.data[0].embedding == pytest.approx(r.data[0].embedding, rel=1e-5)


def test_models_list_and_get(client: openai.OpenAI) -> None:
    ids = [m.id for m in client.models.list()]
    assert MODEL in ids
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_aliases_route_to_the_same_model(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="default", messages=HELLO, max_tokens=2)
    assert r.model == MODEL


def test_json_schema_output_validates(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        max_tokens=80,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}},
    )
    jsonschema.validate(json.loads(r.choices[0].message.content or ""), schema)


def test_json_object_output_parses(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL,
        # Without the grammar this prompt gets a Python code block; with it, exactly {"ok": true}.
        # (The older prompt looped into ever deeper nesting under greedy decoding on AVX2-only builds.)
        messages=[{"role": "user", "content": 'Return the JSON object {"ok": true} and nothing else.'}],
        max_tokens=200,
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content or ""), dict)


def test_n_choices_on_the_in_process_engine(client: openai.OpenAI) -> None:
    """llama.cpp makes one choice per request: the gateway runs n and merges them (seed + i for each)."""
    r = client.chat.completions.create(model=MODEL, messages=HELLO, n=3, max_tokens=6, temperature=1.0, seed=7)
    assert [c.index for c in r.choices] == [0, 1, 2] and all(c.message.content for c in r.choices)
    assert len({c.message.content for c in r.choices}) > 1  # different seeds, different samples
    one = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=6, temperature=1.0, seed=7)
    assert r.usage is not None and one.usage is not None
    assert r.usage.prompt_tokens == one.usage.prompt_tokens and 3 <= r.usage.completion_tokens <= 18  # the prompt once
    stream = client.chat.completions.create(model=MODEL, messages=HELLO, n=2, max_tokens=5, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    texts = ["".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i) for i in (0, 1)]
    assert all(texts) and [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and 2 <= chunks[-1].usage.completion_tokens <= 10
    done = client.completions.create(model=MODEL, prompt=["a", "b"], n=2, max_tokens=2)
    assert sorted(c.index for c in done.choices) == [0, 1, 2, 3]


def test_errors_through_the_client(client: openai.OpenAI, gw: RunningGateway) -> None:
    with pytest.raises(openai.NotFoundError) as nf:
        client.chat.completions.create(model="nope", messages=HELLO)
    assert nf.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=HELLO, n=129)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[])
    r = httpx.post(gw.base_url + "/chat/completions", content=b"{", headers={"content-type": "application/json"})
    assert r.status_code == 400 and orjson.loads(r.content)["error"]["type"] == "invalid_request_error"


def test_health_ready_and_plan(gw: RunningGateway) -> None:
    assert httpx.get(gw.url + "/health").json() == {"status": "ok"}
    ready = httpx.get(gw.url + "/ready").json()
    assert ready["status"] == "ready" and ready["models"][MODEL]["ready"] is True
    plan = httpx.get(gw.base_url + "/gateway/plan").json()
    assert plan["plans"][MODEL]["engine"] == "llamacpp"
    assert plan["hardware"]["cpu"]["logical_cores"] >= 1
