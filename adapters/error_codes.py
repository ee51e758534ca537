"""Every `error.code` the gateway sends, in one table: OpenAI's own code wherever OpenAI documents one for
the same condition, a gateway code (named for what happened) only where OpenAI has none.

Clients match on these (`context_length_exceeded` to trim a conversation, `rate_limit_exceeded` to back
off), so a code is added here before it is used; tests/unit/test_error_codes.py checks every code in
`gateway/` and `adapters/` against this table. docs/conformance.md lists the table's reasoning.
"""

from __future__ import annotations

from typing import Final

# -- OpenAI's codes (platform.openai.com/docs/guides/error-codes and the API's own error bodies) --
CONTEXT_LENGTH_EXCEEDED: Final = "context_length_exceeded"
MODEL_NOT_FOUND: Final = "model_not_found"
INVALID_API_KEY: Final = "invalid_api_key"
RATE_LIMIT_EXCEEDED: Final = "rate_limit_exceeded"
UNSUPPORTED_PARAMETER: Final = "unsupported_parameter"
SERVER_ERROR: Final = "server_error"
PREVIOUS_RESPONSE_NOT_FOUND: Final = "previous_response_not_found"

OPENAI_CODES: Final[dict[str, str]] = {
    CONTEXT_LENGTH_EXCEEDED: "the prompt (plus max tokens) does not fit the model's context",
    MODEL_NOT_FOUND: "no model of that name is served",
    INVALID_API_KEY: "missing or wrong API key",
    RATE_LIMIT_EXCEEDED: "the caller sent more than its limit allows",
    UNSUPPORTED_PARAMETER: "a parameter this model or engine does not support",
    SERVER_ERROR: "the server failed (the Responses API's error.code for a failed response)",
    PREVIOUS_RESPONSE_NOT_FOUND: "Responses: previous_response_id names no stored response",
}

# -- the gateway's own codes: conditions OpenAI's API has no code for --
GATEWAY_CODES: Final[dict[str, str]] = {
    "invalid_token_id": "a token id outside the model's vocabulary (OpenAI documents no code for it)",
    "not_found": "no such route, stored response, replica or file",
    "unsupported_operation": "the model's engine does not serve this route (e.g. embeddings)",
    "invalid_function_call_output": "Responses: a function_call_output answers no earlier function_call",
    "request_too_large": "the request body is over the gateway's limit (413)",
    "request_timeout": "the request headers or body did not arrive in time (408)",
    "queue_full": "the model's admission queue is full: the gateway is overloaded, not the caller over a limit (429)",
    "shutting_down": "the gateway is draining for shutdown (503)",
    "internal_error": "a fault in the gateway itself (500)",
    "no_engine_log": "the engine runs in-process and keeps no log",
    "model_unavailable": "the model cannot be loaded now (503)",
    "model_load_failed": "the model failed to load recently (503)",
    "model_load_timeout": "the model did not load within load_timeout_seconds (503)",
    "model_memory_busy": "the memory the model needs is held by pinned or busy models (503)",
    "model_busy": "the model still has requests running (unload)",
    "model_not_ready": "the model is not loaded in its engine (503)",
    "engine_error": "the engine failed (5xx)",
    "engine_not_installed": "the engine's package or binary is missing (503)",
    "engine_start_failed": "the engine's process did not start",
    "engine_unavailable": "the engine answered 503/529 or is restarting",
    "engine_unreachable": "the engine could not be connected to",
    "engine_reset": "the connection to the engine was lost before it answered",
    "engine_disconnected": "the engine's connection broke mid-response",
    "embeddings_disabled": "the engine runs without embeddings",
    "invalid_engine_options": "the model's engine options are invalid",
    "unsupported_hardware": "the engine cannot run on this machine",
    "upstream_auth": "the engine refused the gateway's own credentials (502)",
    "upstream_timeout": "the engine sent nothing in time (504)",
    "upstream_malformed": "the engine sent an event that is not JSON",
}

CODES: Final[dict[str, str]] = {**OPENAI_CODES, **GATEWAY_CODES}

RESPONSE_ERROR_CODES: Final = frozenset({SERVER_ERROR, RATE_LIMIT_EXCEEDED, "invalid_prompt"})
"""The codes of the spec's ResponseErrorCode enum that a gateway can mean (the rest concern images and
vector stores): a failed Response's `error.code` is one of these."""


def response_error_code(code: str | None, status: int = 500) -> str:
    """A failed Response's `error.code` (an enum in the spec) for any error: 429 -> rate_limit_exceeded,
    a client's bad prompt (context, value) -> invalid_prompt, anything else -> server_error."""
    if code in RESPONSE_ERROR_CODES:
        return code  # type: ignore[return-value]
    if status == 429:
        return RATE_LIMIT_EXCEEDED
    if code == CONTEXT_LENGTH_EXCEEDED or 400 <= status < 500:
        return "invalid_prompt"
    return SERVER_ERROR
