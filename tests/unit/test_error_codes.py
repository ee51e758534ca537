"""Every error code the gateway sends comes from the one table (adapters/error_codes.py), and OpenAI's
own codes are used where OpenAI has one: found by reading the code, so a new literal code fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import orjson
import pytest

from adapters.error_codes import CODES, GATEWAY_CODES, OPENAI_CODES, RESPONSE_ERROR_CODES, response_error_code
from adapters.upstream_errors import error_exception, normalise_error
from adapters.base import ClientRequestError
from tests.conformance.openai_spec import _spec

ROOT = Path(__file__).resolve().parents[2]
# Calls whose positional argument at this index is an error code (besides any `code=` keyword).
CODE_ARG = {"EngineError": 2, "ClientRequestError": 3, "error_event": 1, "error_response": 3, "error_payload": 3,
            "send_error": 3, "ModelUnavailable": 2}


def _codes_in_source() -> dict[str, str]:
    found: dict[str, str] = {}
    for path in sorted([*ROOT.joinpath("gateway").rglob("*.py"), *ROOT.joinpath("adapters").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            values = [k.value for k in node.keywords if k.arg == "code"]
            if name in CODE_ARG and len(node.args) > CODE_ARG[name]:
                values.append(node.args[CODE_ARG[name]])
            for value in values:
                for leaf in ast.walk(value):
                    if isinstance(leaf, ast.Constant) and isinstance(leaf.value, str):
                        found.setdefault(leaf.value, f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_every_code_sent_is_in_the_table() -> None:
    found = _codes_in_source()
    assert len(found) > 20  # the scan sees the codes at all
    unknown = {code: where for code, where in found.items() if code not in CODES}
    assert not unknown, f"error codes not in adapters/error_codes.py (use OpenAI's where one exists): {unknown}"


def test_no_gateway_code_shadows_an_openai_one() -> None:
    assert not set(GATEWAY_CODES) & set(OPENAI_CODES)
    assert "unsupported_parameter" in _codes_in_source()  # the gateway's 400 for what an engine cannot do


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
