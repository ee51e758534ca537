"""Tools, tool_choice and JSON schemas are checked in the gateway, as OpenAI checks them: a client's
mistake is a 400 naming the param, and never reaches an engine (issue 32 item 3)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from adapters.base import Capabilities
from gateway.api.errors import APIError
from gateway.api.tool_checks import (
    check_response_schema,
    check_tool_choice,
    check_tools,
    renamer,
    schema_problem,
)
from gateway.app import create_app
from gateway.config import Settings
from gateway.runtime import runtime_for_adapters
from tests.fakes import EchoAdapter


def fn(name: Any = "get_weather", **extra: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, **extra}}


def nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object"}
    inner = schema
    for _ in range(depth):
        inner["properties"] = {"a": {"type": "object"}}
        inner = inner["properties"]["a"]
    return schema


BAD_TOOLS: list[tuple[Any, str, str]] = [
    # issue 32's flood: a number for a name and a string for parameters (llama-server answered 500)
    ([{"type": "function", "function": {"name": 123, "parameters": "x"}}], "tools[0].function.name", "invalid_type"),
    ([fn(None)], "tools[0].function.name", "invalid_type"),
    ([fn(["a"])], "tools[0].function.name", "invalid_type"),
    ([fn("")], "tools[0].function.name", "invalid_value"),
    ([fn("get weather")], "tools[0].function.name", "invalid_value"),
    ([fn("naïve")], "tools[0].function.name", "invalid_value"),
    ([fn("a" * 65)], "tools[0].function.name", "string_above_max_length"),
    ([fn(), {"type": "function", "function": {"description": "no name"}}], "tools[1].function.name",
     "missing_required_parameter"),
    ([{"type": "function"}], "tools[0].function", "missing_required_parameter"),
    ([{"function": {"name": "f"}}], "tools[0].type", "missing_required_parameter"),
    ([{"type": "custom", "custom": {"name": "grep"}}], "tools[0].type", "invalid_value"),
    ([{"type": "web_search"}], "tools[0].type", "invalid_value"),
    (["get_weather"], "tools[0]", "invalid_type"),
    ("get_weather", "tools", "invalid_type"),
    ([fn(description=7)], "tools[0].function.description", "invalid_type"),
    ([fn(strict="yes")], "tools[0].function.strict", "invalid_type"),
    ([fn(parameters="x")], "tools[0].function.parameters", "invalid_type"),
    ([fn(parameters=[])], "tools[0].function.parameters", "invalid_type"),
    ([fn(parameters={"type": "objekt"})], "tools[0].function.parameters", "invalid_function_parameters"),
    ([fn(parameters={"type": "string"})], "tools[0].function.parameters", "invalid_function_parameters"),
    ([fn(parameters={"type": "object", "properties": {"city": {"type": 5}}})], "tools[0].function.parameters",
     "invalid_function_parameters"),
    ([fn(parameters={"type": "object", "properties": []})], "tools[0].function.parameters", "invalid_function_parameters"),
    ([fn(parameters={"type": "object", "required": "city"})], "tools[0].function.parameters",
     "invalid_function_parameters"),
    ([fn(parameters={"type": "object", "properties": {"n": {"type": "integer", "minimum": "0"}}})],
     "tools[0].function.parameters", "invalid_function_parameters"),
    ([fn(parameters={"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
                     "properties": {"s": {"type": "string", "maxLength": -1}}})],
     "tools[0].function.parameters", "invalid_function_parameters"),
    ([fn(parameters={"type": "object", "properties": {"a": nested(100) | {"type": "objekt"}}})],
     "tools[0].function.parameters", "invalid_function_parameters"),  # deep: still checked
    ([fn(parameters=nested(5000))], "tools[0].function.parameters", "invalid_function_parameters"),  # past the library's
    ([fn()] * 129, "tools", "array_above_max_length"),
]


@pytest.mark.parametrize(("tools", "param", "code"), BAD_TOOLS)
def test_bad_tools_are_openais_400_naming_the_param(tools: Any, param: str, code: str) -> None:
    with pytest.raises(APIError) as caught:
        check_tools(tools)
    error = caught.value
    assert (error.status, error.param, error.code) == (400, param, code), error.message
    assert param in error.message


GOOD_TOOLS: list[Any] = [
    None,
    [],
    [fn()],
    [fn("a" * 64, description=None, strict=None)],
    [fn(parameters={})],
    [fn(parameters={"type": "object", "properties": {}})],
    [fn(parameters={"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                    "required": ["city"], "additionalProperties": False}, strict=True)],
    [fn(parameters={"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
                    "definitions": {"c": {"type": "string"}}, "properties": {"c": {"$ref": "#/definitions/c"}}})],
    [fn(parameters={"type": "object", "$defs": {"c": {"type": "string"}}, "properties": {"c": {"$ref": "#/$defs/c"}}})],
    [fn(parameters=nested(100))],  # 201 levels: what a body may hold
    [fn("a"), fn("b-c_1")],
    [fn()] * 128,
]


@pytest.mark.parametrize("tools", GOOD_TOOLS)
def test_good_tools_pass(tools: Any) -> None:
    assert check_tools(tools) == [t["function"]["name"] for t in tools or []]


@pytest.mark.parametrize(
    ("choice", "names", "param"),
    [
        ("always", ["f"], "tool_choice"),
        ("required", [], "tool_choice"),  # nothing to call
        (5, ["f"], "tool_choice"),
        ({"type": "custom", "custom": {"name": "f"}}, ["f"], "tool_choice.type"),
        ({"type": "allowed_tools", "allowed_tools": {}}, ["f"], "tool_choice.type"),
        ({"type": "function"}, ["f"], "tool_choice.function.name"),
        ({"type": "function", "function": {"name": 3}}, ["f"], "tool_choice.function.name"),
        ({"type": "function", "function": {"name": "g"}}, ["f"], "tool_choice.function.name"),
    ],
)
def test_a_bad_tool_choice_is_a_400(choice: Any, names: list[str], param: str) -> None:
    with pytest.raises(APIError) as caught:
        check_tool_choice(choice, names)
    assert (caught.value.status, caught.value.param) == (400, param)


@pytest.mark.parametrize("choice", [None, "none", "auto", "required", {"type": "function", "function": {"name": "f"}}])
def test_good_tool_choices_pass(choice: Any) -> None:
    check_tool_choice(choice, ["f"])


@pytest.mark.parametrize(
    ("json_schema", "param", "code"),
    [
        (None, "response_format.json_schema", "missing_required_parameter"),
        ({"name": "out"}, "response_format.json_schema.schema", "invalid_json_schema"),
        ({"name": "out", "schema": "x"}, "response_format.json_schema.schema", "invalid_json_schema"),
        ({"name": "out", "schema": {"type": "nope"}}, "response_format.json_schema.schema", "invalid_json_schema"),
        ({"name": "out", "schema": {"properties": {"a": {"enum": 3}}}}, "response_format.json_schema.schema",
         "invalid_json_schema"),
        ({"name": 5, "schema": {}}, "response_format.json_schema.name", "invalid_type"),
        ({"name": "my schema", "schema": {}}, "response_format.json_schema.name", "invalid_value"),
    ],
)
def test_a_bad_response_schema_is_a_400(json_schema: Any, param: str, code: str) -> None:
    with pytest.raises(APIError) as caught:
        check_response_schema(json_schema, "response_format.json_schema")
    assert (caught.value.status, caught.value.param, caught.value.code) == (400, param, code), caught.value.message


def test_a_schema_of_any_top_level_type_may_shape_a_response() -> None:
    check_response_schema({"name": "n", "schema": {"type": "array", "items": {"type": "integer"}}}, "response_format.json_schema")
    check_response_schema({"schema": {"type": "object"}}, "response_format.json_schema")  # no name: the engine needs none
    assert schema_problem({"type": "string"}) is None


def test_a_schema_naming_an_unknown_metaschema_never_makes_the_gateway_fetch_it() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.setblocking(False)
        uri = f"http://127.0.0.1:{server.getsockname()[1]}/meta"
        assert schema_problem({"$schema": uri, "type": "object"}) is None  # checked as 2020-12 instead
        assert "objekt" in (schema_problem({"$schema": uri, "type": "objekt"}) or "")
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody connected


def test_translated_apis_name_their_own_fields() -> None:
    anthropic = renamer({"tools": "tools", "tools.function": "", "tools.parameters": "input_schema"})
    assert anthropic(["tools", 2, "function", "name"]) == "tools[2].name"
    assert anthropic(["tools", 2, "function", "parameters"]) == "tools[2].input_schema"
    assert anthropic(["tool_choice", "function", "name"]) == "tool_choice.function.name"
    assert renamer({})(["tools", 0, "function", "name"]) == "tools[0].function.name"


class ToolEcho(EchoAdapter):
    capabilities = Capabilities(chat=True, completions=True, embeddings=False, tools=True, structured_output=True)


@pytest.fixture
def engine() -> ToolEcho:
    return ToolEcho()


@pytest.fixture
def client(engine: ToolEcho) -> Iterator[TestClient]:
    settings = Settings()
    with TestClient(create_app(settings, runtime_for_adapters(settings, {"echo": engine}))) as c:
        yield c


ASK = [{"role": "user", "content": "weather in Paris?"}]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"messages": ASK, "tools": [{"type": "function", "function": {"name": 123, "parameters": "x"}}]},
         "tools[0].function.name"),
        ("/v1/chat/completions", {"messages": ASK, "stream": True, "tools": [fn(parameters={"type": 1})]},
         "tools[0].function.parameters"),
        # a custom tool forced with "required" (the llama-server adapter forces a function's schema): 400, never a 500
        ("/v1/chat/completions", {"messages": ASK, "tools": [{"type": "custom", "custom": {"name": "grep"}}],
                                  "tool_choice": "required"}, "tools[0].type"),
        ("/v1/chat/completions", {"messages": ASK, "tool_choice": "required"}, "tool_choice"),
        ("/v1/chat/completions", {"messages": ASK, "tools": [fn()], "tool_choice": {"type": "function", "function": {"name": "x"}}},
         "tool_choice.function.name"),
        ("/v1/chat/completions", {"messages": ASK, "response_format": {"type": "json_schema", "json_schema": {
            "name": "w", "schema": {"type": "object", "required": "city"}}}}, "response_format.json_schema.schema"),
        ("/v1/messages", {"max_tokens": 4, "messages": ASK, "tools": [{"name": "get_weather", "input_schema": {"type": 9}}]},
         None),
        ("/v1/messages", {"max_tokens": 4, "messages": ASK, "tools": [{"name": "get weather", "input_schema": {"type": "object"}}]},
         None),
        ("/v1/responses", {"input": "q", "tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": 1}}]},
         "tools[0].parameters"),  # Responses' own (flat) name, not chat's tools[0].function.parameters
        ("/v1/responses", {"input": "q", "tools": [{"type": "function", "name": 7, "parameters": {"type": "object"}}]},
         "tools[0].name"),
        ("/v1/responses", {"input": "q", "text": {"format": {"type": "json_schema", "name": "o", "schema": {"type": "nope"}}}},
         "text.format.schema"),
    ],
)
def test_the_routes_answer_400_and_the_engine_never_sees_it(client: TestClient, engine: ToolEcho, path: str,
                                                            body: dict[str, Any], param: str | None) -> None:
    r = client.post(path, json={"model": "echo", **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error", error
    if path != "/v1/messages":  # Anthropic's error shape has no param
        assert error["param"] == param, error
    else:
        assert "tools[0]" in error["message"], error
    assert engine.seen_bodies == []


def test_good_tools_reach_the_engine(client: TestClient, engine: ToolEcho) -> None:
    r = client.post("/v1/chat/completions", json={"model": "echo", "messages": ASK, "tools": [fn(
        parameters={"type": "object", "properties": {"city": {"type": "string"}}})], "tool_choice": "auto"})
    assert r.status_code == 200, r.text
    assert engine.seen_bodies[0]["tools"][0]["function"]["name"] == "get_weather"


def test_a_body_nested_deeper_than_the_relay_writes_is_a_400_not_a_500(client: TestClient, engine: ToolEcho) -> None:
    """orjson reads 1024 levels but writes 254: a deeper body (a tool schema, or any passed-through field)
    parsed, then failed to be relayed with a TypeError (500)."""
    for body in ({"messages": ASK, "tools": [fn(parameters=nested(200))]}, {"messages": ASK, "extra": nested(200)}):
        r = client.post("/v1/chat/completions", json={"model": "echo", **body})
        assert r.status_code == 400 and "nests deeper than 254 levels" in r.json()["error"]["message"], r.text
    assert engine.seen_bodies == []
    ok = client.post("/v1/chat/completions", json={"model": "echo", "messages": ASK, "tools": [fn(parameters=nested(100))]})
    assert ok.status_code == 200, ok.text
