"""Every `error.code` the gateway itself sends, in one table (docs/reference/errors.md is generated from it):
OpenAI's own code wherever OpenAI documents one for the same condition, a gateway code (named for what
happened) only where OpenAI has none. Clients match on these (`context_length_exceeded` to trim a
conversation, `rate_limit_exceeded` to back off), so a code is added here before it is used.

The code sits beside OpenAI's `type` (from the HTTP status, `upstream_errors.error_type`) in
`{"error": {"message", "type", "param", "code"}}`, in a stream's final `error` event, and in
Anthropic-shaped errors' message. Codes an engine sends itself are relayed as the engine sent
them (a context overflow is mapped to `context_length_exceeded`). tests/unit/test_error_codes.py
fails when the source sends a code this table lacks, or the table lists one nothing sends.
This module lives in `adapters/` because adapters raise codes too and import nothing from `gateway/`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

Origin = Literal["openai", "gateway"]
OPENAI: Final[Origin] = "openai"
GATEWAY: Final[Origin] = "gateway"


@dataclass(frozen=True, slots=True)
class ErrorCode:
    code: str
    origin: Origin  # "openai": OpenAI's own code for this condition; "gateway": OpenAI documents none
    statuses: tuple[int, ...]  # the HTTP statuses it is sent with; () for stream events only
    meaning: str


CONTEXT_LENGTH_EXCEEDED: Final = "context_length_exceeded"
RATE_LIMIT_EXCEEDED: Final = "rate_limit_exceeded"
SERVER_ERROR: Final = "server_error"

ERROR_CODES: tuple[ErrorCode, ...] = (
    # -- the client's request --------------------------------------------------------------------
    ErrorCode("invalid_api_key", OPENAI, (401,), "No API key, or one the gateway does not know, revoked or expired (also "
              "/metrics with `metrics_api_key` set)."),
    ErrorCode("permission_denied", GATEWAY, (403,), "The route needs a key with role admin (docs/keys.md); also POST "
              "/admin/keys on a gateway with no key yet."),
    ErrorCode("key_exists", GATEWAY, (409,), "POST /admin/keys: an active key (or a config-file key) has that name."),
    ErrorCode("keys_active", GATEWAY, (409,), "POST /admin/auth/disable: a key in the store is still active "
              "(revoke every key first)."),
    ErrorCode("request_too_large", GATEWAY, (413,), "The body is larger than `max_body_bytes`."),
    ErrorCode("request_timeout", GATEWAY, (408,), "The request headers (`header_timeout_seconds`) or the body "
              "(`body_timeout_seconds`) did not arrive in time; the connection is closed."),
    ErrorCode("context_length_exceeded", OPENAI, (400,), "The prompt's tokens do not fit the model's context."),
    ErrorCode("integer_above_max_value", OPENAI, (400,), "`max_tokens` (or `max_completion_tokens`, "
              "`max_output_tokens`) above 2^31-1."),
    ErrorCode("unsupported_content", GATEWAY, (400,), "Image or audio content for an engine that cannot take it "
              "(refused before it is sent, so it never counts against the engine)."),
    ErrorCode("invalid_token_id", GATEWAY, (400,), "A token id in `prompt`/`input` lies outside the model's vocabulary."),
    # tools, tool_choice and JSON schemas, checked before an engine sees them (gateway/api/tool_checks.py)
    ErrorCode("invalid_type", OPENAI, (400,), "A field of the wrong JSON type (e.g. a number for `tools[0].function.name`); "
              "`param` names it."),
    ErrorCode("missing_required_parameter", OPENAI, (400,), "A required field is missing (e.g. `tools[0].function`); "
              "`param` names it."),
    ErrorCode("invalid_value", OPENAI, (400,), "A value outside what is accepted: a function name not matching "
              "`^[a-zA-Z0-9_-]+$`, a tool type other than `function`, a `tool_choice` naming no tool; `param` names it."),
    ErrorCode("string_above_max_length", OPENAI, (400,), "A string over its limit (a function name over 64 characters)."),
    ErrorCode("array_above_max_length", OPENAI, (400,), "An array over its limit (more than 128 `tools`)."),
    ErrorCode("invalid_function_parameters", OPENAI, (400,), "A function's `parameters` is not a JSON Schema of an "
              "object (by its metaschema)."),
    ErrorCode("invalid_json_schema", OPENAI, (400,), "`response_format`'s (or `text.format`'s, `output_config.format`'s) "
              "schema is not a JSON Schema (by its metaschema)."),
    ErrorCode("unsupported_parameter", OPENAI, (400,), "A field this engine cannot honour (e.g. `logprobs` on an "
              "in-process engine); `param` names it."),
    ErrorCode("unsupported_operation", GATEWAY, (400,), "The model's engine does not serve this route (e.g. embeddings "
              "on MLX)."),
    ErrorCode("model_not_found", OPENAI, (404, 503), "404: no configured model or alias has this name (the served ones "
              "are listed). 503: the model's weights are not where its `source` says."),
    ErrorCode("not_found", GATEWAY, (404,), "An unknown route, stored response, replica or static file."),
    ErrorCode("previous_response_not_found", OPENAI, (400,), "`previous_response_id` names no stored response."),
    ErrorCode("invalid_function_call_output", GATEWAY, (400,), "A Responses `function_call_output` item that "
              "answers no `function_call` of the conversation."),
    ErrorCode("invalid_header", GATEWAY, (400,), "A scheduling header the gateway cannot read (`x-enginegate-deadline-ms`, "
              "the service-tier header); `param` names it."),
    ErrorCode("deadline_exceeded", GATEWAY, (504,), "The request's `x-enginegate-deadline-ms` passed while it waited in the "
              "queue: it was not started late."),
    ErrorCode("no_engine_log", GATEWAY, (400,), "/admin/engines/{model}/logs for an in-process engine, which keeps no log."),
    # -- capacity: retry later (each with Retry-After) ---------------------------------------------
    ErrorCode("queue_full", GATEWAY, (429,), "The scheduler refused the request: its client's queue bound, or a full "
              "`max_queue` that refuses the client holding the most waiters (or a `flex` request first); "
              "`enginegate_scheduler_refusals_total` counts the reason. The gateway is busy, not the caller over a limit."),
    ErrorCode("rate_limit_exceeded", OPENAI, (429,), "The key's rpm, tpm or max_concurrency is reached; Retry-After says "
              "when its window ends."),
    ErrorCode("insufficient_quota", OPENAI, (429,), "The key's token budget for its period is spent (`x-should-retry: "
              "false`: it renews when the period ends)."),
    ErrorCode("too_many_streams", GATEWAY, (429,), "A key's tenant already holds 8 live streams of "
              "`/admin/requests/stream` open; close one first."),
    ErrorCode("store_unavailable", GATEWAY, (503,), "The key store (SQLite file or Redis) is unreachable or answers "
              "an error (Redis READONLY, OOM) and `tenancy.on_store_error` is `closed`; or the response store was lost "
              "after start-up."),
    ErrorCode("shutting_down", GATEWAY, (503,), "The gateway is draining after SIGTERM; also the final stream event of a "
              "stream cut at the end of `shutdown_grace_seconds`."),
    ErrorCode("model_unavailable", GATEWAY, (503,), "The model cannot serve now, for a reason without a code of its own."),
    ErrorCode("model_memory_busy", GATEWAY, (503,), "The memory the model needs is held by pinned models, so no eviction "
              "can make room now."),
    ErrorCode("model_load_failed", GATEWAY, (503,), "Every engine of the model failed to load; the reasons follow, a new "
              "try comes after 30 s."),
    ErrorCode("model_load_timeout", GATEWAY, (503,), "The model did not load within `load_timeout_seconds` (busy models "
              "held the memory, or the engine was slow)."),
    ErrorCode("model_busy", GATEWAY, (503,), "An admin unload waited too long for the model's running requests."),
    ErrorCode("model_not_ready", GATEWAY, (503,), "An in-process engine was asked before its model loaded."),
    # -- the engine -------------------------------------------------------------------------------
    ErrorCode("engine_not_installed", GATEWAY, (503,), "The engine's package or binary is missing; the message says how "
              "to install it."),
    ErrorCode("engine_start_failed", GATEWAY, (503,), "The engine would not start (its log's last lines follow)."),
    ErrorCode("invalid_engine_options", GATEWAY, (503,), "The model's `options` are not valid for its engine."),
    ErrorCode("unsupported_hardware", GATEWAY, (503,), "The engine cannot run on this GPU (e.g. ExLlamaV3 below compute "
              "capability 8.0)."),
    ErrorCode("embeddings_disabled", GATEWAY, (503,), "`embeddings: false` on the model."),
    ErrorCode("engine_unavailable", GATEWAY, (503,), "The engine answered 503/529 or is restarting."),
    ErrorCode("adapter_load_failed", GATEWAY, (503,), "A LoRA adapter loaded at run time (`lora_loading: runtime`) "
              "could not be loaded on its engine (its path is wrong, or the engine refused it); the gateway's log "
              "names the path and the engine's reason. The base model and the other adapters are not affected."),
    ErrorCode("adapter_slots_full", GATEWAY, (503,), "Every adapter place of the engine (`max_loaded_loras`) was "
              "held by requests in flight for other adapters for `ready_wait` seconds."),
    ErrorCode("engine_unreachable", GATEWAY, (503,), "The engine's port refused the connection."),
    ErrorCode("engine_reset", GATEWAY, (502,), "The engine closed the connection before it answered."),
    ErrorCode("engine_disconnected", GATEWAY, (502,), "The engine's connection was lost mid-response (also a stream's "
              "final event)."),
    ErrorCode("upstream_timeout", GATEWAY, (504,), "The engine sent nothing within the first-byte, idle or total timeout "
              "(also a stream's final event)."),
    ErrorCode("upstream_auth", GATEWAY, (502,), "The engine refused the gateway's credentials (e.g. a wrong "
              "`api_key_env` for an external URL)."),
    ErrorCode("upstream_malformed", GATEWAY, (), "Stream event: the engine sent an event that is not JSON."),
    ErrorCode("engine_error", GATEWAY, (500, 502), "Any other engine failure, when the engine gave no code of its own."),
    ErrorCode("server_error", OPENAI, (), "Responses stream `error` event: the engine failed and named no code."),
    ErrorCode("internal_error", GATEWAY, (500,), "A bug in the gateway (the message names the exception; never a traceback)."),
)

CODES: frozenset[str] = frozenset(entry.code for entry in ERROR_CODES)
OPENAI_CODES: frozenset[str] = frozenset(entry.code for entry in ERROR_CODES if entry.origin == OPENAI)
GATEWAY_CODES: frozenset[str] = CODES - OPENAI_CODES

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
