"""adapters/error_codes.py is the one table of the gateway's error codes: every code the source sends is
in it, every entry is sent somewhere, and OpenAI's own codes are used where OpenAI has one."""

from __future__ import annotations

import ast
from pathlib import Path

import orjson
import pytest

from adapters import error_codes
from adapters.base import ClientRequestError
from adapters.error_codes import CODES, ERROR_CODES, GATEWAY_CODES, OPENAI_CODES, RESPONSE_ERROR_CODES, response_error_code
from adapters.upstream_errors import error_exception, normalise_error
from tests.conformance.openai_spec import _spec

ROOT = Path(__file__).resolve().parents[2]
TABLE_CONSTANTS = {name: value for name, value in vars(error_codes).items() if name.isupper() and isinstance(value, str)}
"""The table's named codes (`CONTEXT_LENGTH_EXCEEDED`), which call sites import instead of a literal."""
# Calls that take a code positionally: name -> index of the code argument.
POSITIONAL = {"EngineError": 2, "ClientRequestError": 3, "ModelUnavailable": 2, "error_event": 1, "send_error": 3,
              "error_response": 3, "error_payload": 3, "APIError": 4}


def _strings(node: ast.AST, constants: dict[str, str]) -> list[str]:
    """String constants an expression can evaluate to (literals, `x or "fallback"`, module constants)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.BoolOp):
        return [s for v in node.values for s in _strings(v, constants)]
    if isinstance(node, ast.Name) and node.id in constants:
        return [constants[node.id]]
    return []


def _callee(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def sent_codes() -> dict[str, list[str]]:
    """code -> where it is written, for every .py under gateway/ and adapters/."""
    found: dict[str, list[str]] = {}
    for path in sorted([*(ROOT / "gateway").rglob("*.py"), *(ROOT / "adapters").rglob("*.py")]):
        if path.name == "error_codes.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        constants = TABLE_CONSTANTS | {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                     and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                     for t in n.targets if isinstance(t, ast.Name) and t.id.isupper()}
        for node in ast.walk(tree):
            values: list[ast.AST] = []
            if isinstance(node, ast.Call):
                values += [k.value for k in node.keywords if k.arg == "code"]
                index = POSITIONAL.get(_callee(node))
                if index is not None and len(node.args) > index:
                    values.append(node.args[index])
            elif isinstance(node, ast.Dict):
                values += [v for k, v in zip(node.keys, node.values)
                           if isinstance(k, ast.Constant) and k.value == "code" and v is not None]
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                for arg, default in zip(args.args[len(args.args) - len(args.defaults):], args.defaults):
                    if arg.arg == "code":
                        values.append(default)
            for value in values:
                for code in _strings(value, constants):
                    found.setdefault(code, []).append(f"{path.relative_to(ROOT)}:{getattr(value, 'lineno', '?')}")
    return found


def test_every_code_sent_is_in_the_table() -> None:
    missing = {code: where for code, where in sent_codes().items() if code not in CODES}
    assert not missing, f"add these codes to adapters/error_codes.py (then python -m gateway.docgen): {missing}"


def test_every_code_in_the_table_is_sent() -> None:
    # a failed Response's error.code is chosen by response_error_code among RESPONSE_ERROR_CODES
    unused = sorted(CODES - set(sent_codes()) - RESPONSE_ERROR_CODES)
    assert not unused, f"adapters/error_codes.py lists codes nothing sends: {unused}"


def test_the_table_has_each_code_once() -> None:
    assert len(CODES) == len(ERROR_CODES)


def test_no_gateway_code_shadows_an_openai_one() -> None:
    assert not set(GATEWAY_CODES) & set(OPENAI_CODES)
    assert "unsupported_parameter" in sent_codes()  # the gateway's 400 for what an engine cannot do


def test_failed_response_codes_are_in_the_spec_enum() -> None:
    enum = set(_spec()["components"]["schemas"]["ResponseErrorCode"]["enum"])
    assert RESPONSE_ERROR_CODES <= enum
    for code, status in [(None, 500), ("engine_disconnected", 502), ("queue_full", 429), ("context_length_exceeded", 400),
                         ("server_error", 500), ("upstream_timeout", 504)]:
        assert response_error_code(code, status) in enum


@pytest.mark.parametrize(("raw", "why"), [
    ({"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error", "n_prompt_tokens": 9000, "n_ctx": 4096}}, "llama-server"),
    ({"error": {"message": "This model's maximum context length is 2048 tokens. However, you requested 3000 tokens.",
                "type": "BadRequestError", "param": None, "code": 400}}, "vLLM"),
    ({"object": "error", "message": "The input (5000 tokens) is longer than the model's context length (4096 tokens).",
      "type": "BadRequestError", "param": None, "code": 400}, "SGLang"),
    ({"detail": {"message": "too long", "code": "context_length_exceeded"}}, "TabbyAPI"),
])
def test_engines_context_errors_become_openais_code(raw: dict[str, object], why: str) -> None:
    assert normalise_error(400, orjson.dumps(raw))["error"]["code"] == "context_length_exceeded", why
    exc = error_exception(400, orjson.dumps(raw))
    assert isinstance(exc, ClientRequestError) and exc.code == "context_length_exceeded"


def test_other_400s_keep_their_code() -> None:
    raw = b'{"error": {"message": "temperature must be <= 2", "type": "BadRequestError", "param": "temperature", "code": 400}}'
    assert normalise_error(400, raw)["error"]["code"] is None
