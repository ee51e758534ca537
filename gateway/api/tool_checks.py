"""Checks of a chat request's tools, tool_choice and JSON schemas, before any engine sees them.

An engine handed a tool list or a schema it cannot read fails the request in its own way (llama-server
answers 500), which the gateway would have to guess was the client's fault. These checks answer the
client's mistake as OpenAI does: 400 `invalid_request_error`, with `param` naming the field
(`tools[0].function.name`) and OpenAI's codes (`invalid_type`, `missing_required_parameter`,
`invalid_value`, `string_above_max_length`, `array_above_max_length`, `invalid_function_parameters`,
`invalid_json_schema`). A schema must be a JSON Schema by its metaschema, by its `$schema` draft
(2020-12 when it names none or one unknown); its nesting is bounded by the body's (serving.parse_body:
254 levels, under what jsonschema-rs reads, 255; llama-server took 961 here). The request's
shape is checked with `jsonschema`; schemas against their metaschema with `jsonschema_rs` (Rust):
about 5 µs a small schema and 30 ms a MB here, where `jsonschema`'s 2020-12 metaschema check took
2 ms and 17 s, on the event loop.

Pure functions of the request; they raise `APIError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from jsonschema import Draft202012Validator, ValidationError
from jsonschema_rs import ReferencingError, Registry, meta
from jsonschema_rs import ValidationError as SchemaInvalid

from gateway.api.errors import APIError

NAME_PATTERN = "^[a-zA-Z0-9_-]+$"
NAME_MAX = 64
MAX_TOOLS = 128
TOOL_CHOICES = ("none", "auto", "required")

_NAME = {"type": "string", "pattern": NAME_PATTERN, "maxLength": NAME_MAX}
_FUNCTION = {
    "type": "object",
    "properties": {
        "name": _NAME,
        "description": {"type": ["string", "null"]},
        "parameters": {"type": "object"},
        "strict": {"type": ["boolean", "null"]},
    },
    "required": ["name"],
}
TOOLS_SHAPE: dict[str, Any] = {
    "type": "array",
    "maxItems": MAX_TOOLS,
    "items": {
        "type": "object",
        "properties": {"type": {"const": "function"}, "function": _FUNCTION},
        "required": ["type", "function"],
    },
}
"""OpenAI's chat `tools`, as far as the gateway serves them: function tools only."""

_TOOLS = Draft202012Validator(TOOLS_SHAPE)
_NAMES = Draft202012Validator(_NAME)

Param = Callable[[Sequence[str | int]], str]
"""A location inside the request (["tools", 0, "function", "name"]) -> the name the client knows it by."""


def dotted(path: Iterable[str | int]) -> str:
    """["tools", 0, "function", "name"] -> "tools[0].function.name" (OpenAI's spelling of a param)."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def renamer(names: Mapping[str, str]) -> Param:
    """A chat-shaped location -> the client's name for it: `names["tools.function"]` replaces a tool's
    `function` step ("" drops it: Anthropic's and Responses' tools are flat), `names["tools.parameters"]`
    its `parameters`, `names["tool_choice"]` the choice."""

    def param(path: Sequence[str | int]) -> str:
        out: list[str | int] = []
        for i, part in enumerate(path):
            if path[0] == "tools" and i == 2 and part == "function" and "tools.function" in names:
                if names["tools.function"]:
                    out.append(names["tools.function"])
            elif path[0] == "tools" and i == 3 and part == "parameters" and "tools.parameters" in names:
                out.append(names["tools.parameters"])
            elif i == 0:
                out.append(names.get(str(part), str(part)))
            else:
                out.append(part)
        return dotted(out)

    return param


_JSON_TYPES = {"string": "a string", "integer": "an integer", "number": "a number", "boolean": "a boolean",
               "object": "an object", "array": "an array", "null": "null"}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def shape_error(error: ValidationError, param: Param, prefix: Sequence[str | int] = ()) -> APIError:
    """A request field that fails its shape -> OpenAI's message and code for that kind of failure
    (`prefix`: where the checked value sits in the request)."""
    where = [*prefix, *error.absolute_path]
    name = param(where)
    kind = error.validator
    if kind == "type":
        expected = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
        wanted = " or ".join(_JSON_TYPES.get(str(t), str(t)) for t in expected if t != "null")
        return APIError(400, f"Invalid type for '{name}': expected {wanted}, but got {_json_type(error.instance)} instead.",
                        param=name, code="invalid_type")
    if kind == "required":
        missing = next((r for r in error.validator_value if isinstance(error.instance, dict) and r not in error.instance), "")
        name = param([*where, missing])
        return APIError(400, f"Missing required parameter: '{name}'.", param=name, code="missing_required_parameter")
    if kind == "maxLength":
        return APIError(400, f"Invalid '{name}': string too long. Expected a string with maximum length "
                             f"{error.validator_value}, but got a string with length {len(error.instance)} instead.",
                        param=name, code="string_above_max_length")
    if kind == "maxItems":
        return APIError(400, f"Invalid '{name}': array too long. Expected an array with maximum length "
                             f"{error.validator_value}, but got an array with length {len(error.instance)} instead.",
                        param=name, code="array_above_max_length")
    if kind == "pattern":
        return APIError(400, f"Invalid '{name}': string does not match pattern. Expected a string that matches the "
                             f"pattern '{error.validator_value}'.", param=name, code="invalid_value")
    if kind == "const" and where and where[-1] == "type":
        return APIError(400, f"Invalid value for '{name}': {_shown(error.instance)}. Supported values are: "
                             f"'{error.validator_value}' (this gateway serves function tools only).",
                        param=name, code="invalid_value")
    return APIError(400, f"Invalid '{name}': {error.message}", param=name, code="invalid_value")


def _shown(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 64 else text[:61] + "..."


def _refuse(uri: str) -> Any:
    raise LookupError(f"{uri} is not fetched")


_OFFLINE = Registry([], retriever=_refuse)
"""Metaschemas are the library's own: a `$schema` naming any other URI is never fetched (no request
leaves the gateway on a client's word)."""


def schema_problem(schema: Any) -> str | None:
    """Why `schema` is not a JSON Schema the gateway passes on (None: it is one)."""
    if not isinstance(schema, dict):
        return f"expected a JSON Schema object, but got {_json_type(schema)}"
    try:
        try:
            meta.validate(schema, registry=_OFFLINE)
        except ReferencingError:  # a $schema the library does not know: checked as 2020-12
            meta.validate({k: v for k, v in schema.items() if k != "$schema"}, registry=_OFFLINE)
    except SchemaInvalid as exc:
        where = dotted(exc.instance_path)
        return exc.message + (f" (at {where})" if where else "")
    except ReferencingError as exc:
        return f"it cannot be checked: {exc}"[:300]
    except ValueError as exc:  # past the library's recursion limit (255 levels: deeper than a body may nest)
        return f"it cannot be checked: {exc}"[:300]
    return None


def check_function_parameters(schema: Any, function: str, param: str) -> None:
    problem = schema_problem(schema)
    if problem is None and isinstance(schema, dict) and "type" in schema and schema["type"] != "object":
        problem = f"schema must be a JSON Schema of type \"object\", got type {_shown(schema['type'])}"
    if problem is not None:
        raise APIError(400, f"Invalid schema for function {_shown(function)} ({param}): {problem}.", param=param,
                       code="invalid_function_parameters")


def check_tools(tools: Any, param: Param = dotted) -> list[str]:
    """The tools' shape (OpenAI's function tools) and each one's parameters schema; returns their names."""
    if tools is None:
        return []
    error = next(iter(_TOOLS.iter_errors(tools)), None)
    if error is not None:
        raise shape_error(error, param, ["tools"])
    names = []
    for i, tool in enumerate(tools):
        function = tool["function"]
        names.append(function["name"])
        if "parameters" in function:
            check_function_parameters(function["parameters"], function["name"], param(["tools", i, "function", "parameters"]))
    return names


def check_tool_choice(choice: Any, names: Sequence[str], param: Param = dotted) -> None:
    """`none`, `auto`, `required` or a named function among the tools; a forced choice needs tools."""
    if choice is None:
        return
    where = param(["tool_choice"])
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise APIError(400, f"Invalid value for '{where}': {_shown(choice)}. Supported values are: 'none', 'auto', "
                                "and 'required'.", param=where, code="invalid_value")
        if choice == "required" and not names:
            raise APIError(400, f"Invalid value for '{where}': 'tool_choice' is only allowed when 'tools' are specified.",
                           param=where, code="invalid_value")
        return
    if not isinstance(choice, Mapping):
        raise APIError(400, f"Invalid type for '{where}': expected a string or an object, but got "
                            f"{_json_type(choice)} instead.", param=where, code="invalid_type")
    if choice.get("type") != "function":
        name = param(["tool_choice", "type"])
        raise APIError(400, f"Invalid value for '{name}': {_shown(choice.get('type'))}. Supported values are: "
                            "'function' (this gateway serves function tools only).", param=name, code="invalid_value")
    function = choice.get("function")
    picked = function.get("name") if isinstance(function, Mapping) else None
    name = param(["tool_choice", "function", "name"])
    if not isinstance(picked, str):
        raise APIError(400, f"Missing required parameter: '{name}'.", param=name, code="missing_required_parameter")
    if picked not in names:
        raise APIError(400, f"Invalid value for '{name}': no function named {_shown(picked)} is in 'tools'.",
                       param=name, code="invalid_value")


def check_response_schema(json_schema: Any, param: str) -> None:
    """`response_format.json_schema`: an object with a usable name (when given) and a JSON Schema object."""
    if not isinstance(json_schema, Mapping):
        raise APIError(400, f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")
    name = json_schema.get("name")
    if name is not None:
        error = next(iter(_NAMES.iter_errors(name)), None)
        if error is not None:
            raise shape_error(error, lambda _: f"{param}.name")
    schema = json_schema.get("schema")
    problem = schema_problem(schema)
    if problem is not None:
        raise APIError(400, f"Invalid schema for response_format {_shown(name or 'schema')}: {problem}.",
                       param=f"{param}.schema", code="invalid_json_schema")
