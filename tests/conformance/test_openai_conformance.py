"""Real responses of every route, validated against OpenAI's published spec (the pinned component schemas),
on every engine: llama.cpp in-process (the embedded SmolLM2), a real llama-server, and the emulators of
the engines that cannot run here (vLLM, SGLang, TensorRT-LLM, ExLlamaV3/TabbyAPI, Dynamo) behind their
real adapters. One `enginegate serve` process serves them all (each model loads on its first request).

Where the real API and the spec disagree the test follows the real API: see openai_spec.EXCEPTIONS.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pydantic
import pytest
import yaml

from adapters.llama_server import find_llama_server
from gateway.modelsource import embedded_model_path
from tests.conformance.openai_spec import check, check_event
from tests.engines.real_engines import missing
from tests.gateway_process import REPO_ROOT, RunningGateway, gateway

pytestmark = pytest.mark.integration

LOCAL = "smollm"  # llama.cpp in-process
SERVER = "smollm-server"  # llama-server
EMULATED = {"vllm": "vllm", "sglang": "sglang", "tensorrt_llm": "tensorrt_llm", "exllamav3": "tabby", "dynamo": "dynamo_frontend"}
FAILING = "vllm-failing"  # an engine whose generation fails after one token
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Local time in a city",
                                           "parameters": WEATHER}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CITY_SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
               "additionalProperties": False}


def _fake(engine: str, root: Path, args: str = "--tokens 5") -> dict[str, Any]:
    program = [sys.executable, "-m", "tests.engines.fake_engine"]
    options: dict[str, Any] = {"executable": [*program, EMULATED.get(engine, engine)], "log_dir": str(root / "logs"),
                               "env": {"PYTHONPATH": str(REPO_ROOT), "FAKE_ENGINE_ARGS": args}}
    if engine == "dynamo":
        options["worker_executable"] = [*program, "dynamo_worker"]
    if engine == "exllamav3":
        options["compute_capability"] = "8.6"
    return options


def _config(root: Path) -> str:
    weights = str(embedded_model_path())
    source = root / "tiny-model"
    source.mkdir(exist_ok=True)
    models: list[dict[str, Any]] = [
        {"source": weights, "name": LOCAL, "engine": "llamacpp", "threads": 2, "context_length": 1024},
        {"source": weights, "name": SERVER, "engine": "llama_server", "threads": 1, "context_length": 1024,
         "options": {"log_dir": str(root / "logs")}},
    ]
    for engine in EMULATED:
        models.append({"source": str(source), "name": engine, "engine": engine, "options": _fake(engine, root)})
    models.append({"source": str(source), "name": FAILING, "engine": "vllm",
                   "options": _fake("vllm", root, "--tokens 5 --error-after-tokens 1")})
    return yaml.safe_dump({"models": models})


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    root = tmp_path_factory.mktemp("conformance")
    env = {"ENGINEGATE_RESPONSE_STORE__PATH": str(root / "responses.sqlite3")}
    with gateway(config_yaml=_config(root), env=env) as running:
        yield running


@pytest.fixture(params=[LOCAL, SERVER, *EMULATED])
def model(request: pytest.FixtureRequest) -> str:
    if request.param == SERVER and find_llama_server(None) is None:
        missing("llama-server is not built (make llama-server)")
    return str(request.param)


def post(gw: RunningGateway, path: str, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    r = httpx.post(gw.base_url + path, json=body, timeout=300)
    assert r.status_code == status, r.text
    return r.json()  # type: ignore[no-any-return]


def sse(gw: RunningGateway, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every `data:` payload of a stream, `[DONE]` checked and left out."""
    with httpx.stream("POST", gw.base_url + path, json={**body, "stream": True}, timeout=300) as r:
        assert r.status_code == 200, r.read().decode()
        text = r.read().decode()
    payloads = [line[6:] for line in text.split("\n") if line.startswith("data: ")]
    if path != "/responses":
        assert payloads[-1] == "[DONE]", text[-500:]
        payloads = payloads[:-1]
    return [json.loads(p) for p in payloads]


def check_chunks(chunks: list[dict[str, Any]], with_usage: bool = True) -> None:
    for chunk in chunks:
        check("CreateChatCompletionStreamResponse", chunk)
    if with_usage:
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0
        assert all(c["choices"] for c in chunks[:-1])


def accumulate(chunks: list[dict[str, Any]], choice: int = 0) -> list[dict[str, str]]:
    """As the official SDKs accumulate a streamed tool call: every string field appended, keyed by index."""
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for c in chunk["choices"]:
            if c["index"] != choice:
                continue
            for call in c["delta"].get("tool_calls") or []:
                acc = calls.setdefault(call["index"], {"id": "", "type": "", "name": "", "arguments": ""})
                for key in ("id", "type"):
                    acc[key] += call.get(key) or ""
                fn = call.get("function") or {}
                acc["name"] += fn.get("name") or ""
                acc["arguments"] += fn.get("arguments") or ""
    return [calls[i] for i in sorted(calls)]


def one_call(calls: list[dict[str, Any]], names: set[str]) -> dict[str, Any]:
    assert len(calls) == 1, calls
    call = calls[0]
    name = call["function"]["name"] if "function" in call else call["name"]
    arguments = call["function"]["arguments"] if "function" in call else call["arguments"]
    assert name in names, call
    assert isinstance(json.loads(arguments), dict), arguments
    return call


# -- chat -----------------------------------------------------------------------------------------


def test_chat_whole_and_streamed(gw: RunningGateway, model: str) -> None:
    body = {"model": model, "messages": ASK, "max_tokens": 8}
    check("CreateChatCompletionResponse", post(gw, "/chat/completions", body))
    check_chunks(sse(gw, "/chat/completions", {**body, "stream_options": {"include_usage": True}}))
    check_chunks(sse(gw, "/chat/completions", body), with_usage=False)


def test_chat_n_choices(gw: RunningGateway, model: str) -> None:
    body = {"model": model, "messages": ASK, "max_tokens": 4, "n": 2}
    whole = post(gw, "/chat/completions", body)
    check("CreateChatCompletionResponse", whole)
    assert [c["index"] for c in whole["choices"]] == [0, 1]
    chunks = sse(gw, "/chat/completions", {**body, "stream_options": {"include_usage": True}})
    check_chunks(chunks)
    assert {c["index"] for chunk in chunks for c in chunk["choices"]} == {0, 1}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_forced_tool_call_whole_and_streamed(gw: RunningGateway, model: str, choice: Any) -> None:
    names = {"get_weather", "get_time"} if choice == "required" else {"get_time"}
    body = {"model": model, "messages": ASK, "tools": TOOLS, "tool_choice": choice, "max_tokens": 60, "temperature": 0}
    whole = post(gw, "/chat/completions", body)
    check("CreateChatCompletionResponse", whole)
    assert whole["choices"][0]["finish_reason"] == "tool_calls"
    message = whole["choices"][0]["message"]
    assert message["refusal"] is None and "function_call" not in message
    one_call(message["tool_calls"], names)
    chunks = sse(gw, "/chat/completions", {**body, "stream_options": {"include_usage": True}})
    check_chunks(chunks)
    calls = accumulate(chunks)
    one_call([{"function": c} for c in calls], names)
    assert calls[0]["type"] == "function" and calls[0]["id"], calls
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"
    opening = [call for c in chunks for ch in c["choices"] for call in ch["delta"].get("tool_calls") or [] if "id" in call]
    assert len(opening) == 1, "id/type/name only in the first chunk of the call"


def test_tool_choice_auto(gw: RunningGateway, model: str) -> None:
    body = {"model": model, "messages": ASK, "tools": TOOLS, "tool_choice": "auto", "max_tokens": 8}
    check("CreateChatCompletionResponse", post(gw, "/chat/completions", body))
    check_chunks(sse(gw, "/chat/completions", {**body, "stream_options": {"include_usage": True}}))


@pytest.mark.parametrize("fmt", [{"type": "json_object"},
                                 {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA, "strict": True}}])
def test_structured_output(gw: RunningGateway, model: str, fmt: dict[str, Any]) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "Name a city as JSON."}], "response_format": fmt,
            "max_tokens": 40, "temperature": 0}
    whole = post(gw, "/chat/completions", body)
    check("CreateChatCompletionResponse", whole)
    check_chunks(sse(gw, "/chat/completions", {**body, "stream_options": {"include_usage": True}}))
    if model in (LOCAL, SERVER) and whole["choices"][0]["finish_reason"] == "stop":  # the emulators write tok0...
        parsed = json.loads(whole["choices"][0]["message"]["content"])
        assert isinstance(parsed, dict)
        if fmt["type"] == "json_schema":
            assert isinstance(parsed["city"], str)


# -- completions, embeddings, models --------------------------------------------------------------


def test_completions_whole_and_streamed(gw: RunningGateway, model: str) -> None:
    body = {"model": model, "prompt": "The capital of France is", "max_tokens": 5}
    check("CreateCompletionResponse", post(gw, "/completions", body))
    chunks = sse(gw, "/completions", {**body, "stream_options": {"include_usage": True}})
    for chunk in chunks[:-1]:
        check("CreateCompletionResponse", chunk)  # finish_reason null until the last: an exception
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


def test_embeddings_float_and_base64(gw: RunningGateway, model: str) -> None:
    r = httpx.post(gw.base_url + "/embeddings", json={"model": model, "input": ["hello world", "bye"]}, timeout=300)
    if r.status_code == 400 and r.json()["error"]["code"] == "unsupported_operation":
        check("ErrorResponse", r.json())
        pytest.skip(f"{model}'s engine serves no embeddings (its 400 checked)")
    assert r.status_code == 200, r.text
    floats = r.json()
    check("CreateEmbeddingResponse", floats)
    b64 = post(gw, "/embeddings", {"model": model, "input": ["hello world", "bye"], "encoding_format": "base64"})
    check("CreateEmbeddingResponse", b64)  # a string vector: an exception
    vector = base64.b64decode(b64["data"][0]["embedding"])
    assert len(vector) == 4 * len(floats["data"][0]["embedding"])


def test_models(gw: RunningGateway) -> None:
    listed = httpx.get(gw.base_url + "/models", timeout=30).json()
    check("ListModelsResponse", listed)
    assert {LOCAL, *EMULATED} <= {m["id"] for m in listed["data"]}
    one = httpx.get(gw.base_url + f"/models/{LOCAL}", timeout=30)
    if one.status_code == 200:
        check("Model", one.json())


# -- Responses ------------------------------------------------------------------------------------


def check_responses_stream(events: list[dict[str, Any]]) -> set[str]:
    kinds = {check_event(e) for e in events}
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return kinds


def test_responses_text(gw: RunningGateway, model: str) -> None:
    body = {"model": model, "input": "Name a colour.", "max_output_tokens": 8, "user": "conformance"}
    whole = post(gw, "/responses", body)
    check("Response", whole)
    assert whole["usage"]["input_tokens_details"]["cache_write_tokens"] >= 0
    events = sse(gw, "/responses", {k: v for k, v in body.items() if k != "user"})
    kinds = check_responses_stream(events)
    assert {"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
            "response.output_text.delta", "response.output_text.done", "response.content_part.done",
            "response.output_item.done"} <= kinds
    assert kinds & {"response.completed", "response.incomplete"}
    created = events[0]["response"]
    assert "usage" not in created and "user" not in created


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_time"}])
def test_responses_forced_tool_call(gw: RunningGateway, model: str, choice: Any) -> None:
    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    names = {"get_weather", "get_time"} if choice == "required" else {"get_time"}
    body = {"model": model, "input": "What is the weather in Paris?", "tools": tools, "tool_choice": choice,
            "max_output_tokens": 60, "temperature": 0}
    whole = post(gw, "/responses", body)
    check("Response", whole)
    assert all("strict" in t for t in whole["tools"])
    one_call([o for o in whole["output"] if o["type"] == "function_call"], names)
    events = sse(gw, "/responses", body)
    kinds = check_responses_stream(events)
    assert {"response.function_call_arguments.delta", "response.function_call_arguments.done"} <= kinds
    final = events[-1]["response"]
    one_call([o for o in final["output"] if o["type"] == "function_call"], names)


# -- errors ---------------------------------------------------------------------------------------


def test_error_bodies(gw: RunningGateway, model: str) -> None:
    unknown = post(gw, "/chat/completions", {"model": "no-such-model", "messages": ASK}, 404)
    check("ErrorResponse", unknown)
    assert unknown["error"]["code"] == "model_not_found"
    check("ErrorResponse", post(gw, "/chat/completions", {"model": model, "messages": ASK, "temperature": 7}, 400))
    check("ErrorResponse", post(gw, "/chat/completions", {"model": model, "messages": []}, 400))
    long = " ".join(["word"] * 5000)
    over = post(gw, "/chat/completions", {"model": model, "messages": [{"role": "user", "content": long}], "max_tokens": 8}, 400)
    check("ErrorResponse", over)
    assert over["error"]["code"] == "context_length_exceeded", over


def test_errors_mid_stream(gw: RunningGateway) -> None:
    """An engine that fails while generating: the chat stream's error event and the Responses
    `error` + `response.failed` events, each in the spec's shape."""
    chunks = sse_without_done(gw, "/chat/completions", {"model": FAILING, "messages": ASK})
    assert "error" in chunks[-1]
    check("ErrorResponse", chunks[-1])
    for chunk in chunks[:-1]:
        check("CreateChatCompletionStreamResponse", chunk)
    events = sse(gw, "/responses", {"model": FAILING, "input": "hi"})
    kinds = check_responses_stream(events)
    assert "error" in kinds or "response.failed" in kinds, kinds
    failed = [e for e in events if e["type"] == "response.failed"]
    if failed:
        assert failed[0]["response"]["error"]["code"]


def sse_without_done(gw: RunningGateway, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", gw.base_url + path, json={**body, "stream": True}, timeout=300) as r:
        assert r.status_code == 200
        text = r.read().decode()
    return [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: ") and line != "data: [DONE]"]


# -- typed clients' stream helpers ----------------------------------------------------------------

TS_DIR = REPO_ROOT / "tests" / "ts"


class City(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    city: str = pydantic.Field(max_length=20)


@pytest.fixture(params=[LOCAL, "vllm"])
def sdk(request: pytest.FixtureRequest, gw: RunningGateway) -> tuple[openai.OpenAI, str]:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=300), str(request.param)


def test_python_sdk_chat_stream_helper_accumulates_one_tool_call(sdk: tuple[openai.OpenAI, str]) -> None:
    client, model = sdk
    tools = [openai.pydantic_function_tool(City, name="get_weather", description="Current weather in a city"),
             openai.pydantic_function_tool(City, name="get_time", description="Local time in a city")]
    done: list[tuple[str, str]] = []
    with client.chat.completions.stream(model=model, messages=ASK, tools=tools, tool_choice="required",  # type: ignore[arg-type]
                                        max_tokens=60, temperature=0) as stream:
        for event in stream:
            if event.type == "tool_calls.function.arguments.done":
                done.append((event.name, event.arguments))
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls or []
    assert len(calls) == 1 and calls[0].function.name in {"get_weather", "get_time"}, calls
    assert isinstance(calls[0].function.parsed_arguments, City)
    assert done == [(calls[0].function.name, calls[0].function.arguments)]


def test_python_sdk_parses_a_structured_output(sdk: tuple[openai.OpenAI, str]) -> None:
    client, model = sdk
    if model != LOCAL:
        pytest.skip("the emulators write `tok0 tok1 ...`, not JSON: only a real engine's constrained output parses")
    ask = [{"role": "user", "content": "Name a city as JSON."}]
    with client.chat.completions.stream(model=model, messages=ask, response_format=City,  # type: ignore[arg-type]
                                        max_tokens=40, temperature=0) as stream:
        final = stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, City)
    whole = client.chat.completions.parse(model=model, messages=ask, response_format=City, max_tokens=40,  # type: ignore[arg-type]
                                          temperature=0)
    assert whole.choices[0].message.refusal is None and isinstance(whole.choices[0].message.parsed, City)


def test_python_sdk_responses_stream_helper(sdk: tuple[openai.OpenAI, str]) -> None:
    client, model = sdk
    tool = openai.pydantic_function_tool(City, name="get_weather", description="Current weather in a city")
    with client.responses.stream(model=model, input="What is the weather in Paris?", tools=[tool],  # type: ignore[list-item]
                                 max_output_tokens=60, tool_choice="required", temperature=0) as stream:
        final = stream.get_final_response()
    calls = [o for o in final.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and isinstance(calls[0].parsed_arguments, City)  # type: ignore[union-attr]
    if model != LOCAL:
        return  # the emulators write `tok0 tok1 ...`, not JSON: only a real engine's constrained output parses
    with client.responses.stream(model=model, input="Name a city as JSON.", text_format=City, max_output_tokens=40,
                                 temperature=0) as stream:
        parsed = stream.get_final_response().output_parsed
    assert isinstance(parsed, City)


def test_typescript_sdk_helpers(gw: RunningGateway) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    if not (TS_DIR / "node_modules" / "openai").is_dir():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=TS_DIR, check=True, timeout=300)
    run = subprocess.run([node, "sdk_helpers.mjs"], cwd=TS_DIR, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "GATEWAY_URL": gw.base_url, "MODEL": LOCAL})
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    (call,) = out["stream_calls"]
    assert call["name"] in {"get_weather", "get_time"} and call["type"] == "function" and call["id"]
    assert isinstance(json.loads(call["arguments"])["city"], str) and call["parsed"] == json.loads(call["arguments"])
    assert out["stream_done_events"] == [{"name": call["name"], "arguments": call["arguments"]}]
    (ran,) = out["run_tools_calls"]
    assert isinstance(ran["city"], str)
    assert isinstance(out["structured"]["city"], str)
    (rcall,) = out["responses_calls"]
    assert rcall["name"] == "get_weather" and isinstance(json.loads(rcall["arguments"])["city"], str)
