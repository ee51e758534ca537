"""Every `error.code` the gateway itself sends, in one table (docs/reference/errors.md is generated from it).

The code sits beside OpenAI's `type` (from the HTTP status, `upstream_errors.error_type`) in
`{"error": {"message", "type", "param", "code"}}`, in a stream's final `error` event, and in
Anthropic-shaped errors' message. Codes an engine sends itself are relayed as the engine sent
them and are not listed here. Call sites write the code as a string literal;
tests/unit/test_error_codes.py fails when one is not in this table (or an entry is never used).
This module lives in `adapters/` because adapters raise codes too and import nothing from `gateway/`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ErrorCode:
    code: str
    statuses: tuple[int, ...]  # the HTTP statuses it is sent with; () for stream events only
    meaning: str


ERROR_CODES: tuple[ErrorCode, ...] = (
    # -- the client's request --------------------------------------------------------------------
    ErrorCode("invalid_api_key", (401,), "No API key, or one the gateway does not know (also /metrics with "
              "`metrics_api_key` set)."),
    ErrorCode("request_too_large", (413,), "The body is larger than `max_body_bytes`."),
    ErrorCode("request_timeout", (408,), "The request headers (`header_timeout_seconds`) or the body "
              "(`body_timeout_seconds`) did not arrive in time; the connection is closed."),
    ErrorCode("context_length_exceeded", (400,), "The prompt's tokens do not fit the model's context."),
    ErrorCode("invalid_token_id", (400,), "A token id in `prompt`/`input` lies outside the model's vocabulary."),
    ErrorCode("unsupported_parameter", (400,), "A field this engine cannot honour (e.g. `logprobs` on an "
              "in-process engine); `param` names it."),
    ErrorCode("unsupported_operation", (400,), "The model's engine does not serve this route (e.g. embeddings "
              "on MLX)."),
    ErrorCode("model_not_found", (404, 503), "404: no configured model or alias has this name (the served ones "
              "are listed). 503: the model's weights are not where its `source` says."),
    ErrorCode("not_found", (404,), "An unknown route, stored response, replica or static file."),
    ErrorCode("previous_response_not_found", (400,), "`previous_response_id` names no stored response."),
    ErrorCode("invalid_function_call_output", (400,), "A Responses `function_call_output` item that "
              "answers no `function_call` of the conversation."),
    ErrorCode("invalid_header", (400,), "A scheduling header the gateway cannot read (`x-enginegate-deadline-ms`, "
              "the service-tier header); `param` names it."),
    ErrorCode("deadline_exceeded", (504,), "The request's `x-enginegate-deadline-ms` passed while it waited in the "
              "queue: it was not started late."),
    ErrorCode("no_engine_log", (400,), "/admin/engines/{model}/logs for an in-process engine, which keeps no log."),
    # -- capacity: retry later (each with Retry-After) ---------------------------------------------
    ErrorCode("queue_full", (429,), "The scheduler refused the request: its client's queue bound, or a full "
              "`max_queue` that refuses the client holding the most waiters (or a `flex` request first); "
              "`enginegate_scheduler_refusals_total` counts the reason."),
    ErrorCode("shutting_down", (503,), "The gateway is draining after SIGTERM; also the final stream event of a "
              "stream cut at the end of `shutdown_grace_seconds`."),
    ErrorCode("model_unavailable", (503,), "The model cannot serve now, for a reason without a code of its own."),
    ErrorCode("model_memory_busy", (503,), "The memory the model needs is held by pinned models, so no eviction "
              "can make room now."),
    ErrorCode("model_load_failed", (503,), "Every engine of the model failed to load; the reasons follow, a new "
              "try comes after 30 s."),
    ErrorCode("model_load_timeout", (503,), "The model did not load within `load_timeout_seconds` (busy models "
              "held the memory, or the engine was slow)."),
    ErrorCode("model_busy", (503,), "An admin unload waited too long for the model's running requests."),
    ErrorCode("model_not_ready", (503,), "An in-process engine was asked before its model loaded."),
    # -- the engine -------------------------------------------------------------------------------
    ErrorCode("engine_not_installed", (503,), "The engine's package or binary is missing; the message says how "
              "to install it."),
    ErrorCode("engine_start_failed", (503,), "The engine would not start (its log's last lines follow)."),
    ErrorCode("invalid_engine_options", (503,), "The model's `options` are not valid for its engine."),
    ErrorCode("unsupported_hardware", (503,), "The engine cannot run on this GPU (e.g. ExLlamaV3 below compute "
              "capability 8.0)."),
    ErrorCode("embeddings_disabled", (503,), "`embeddings: false` on the model."),
    ErrorCode("engine_unavailable", (503,), "The engine answered 503/529 or is restarting."),
    ErrorCode("engine_unreachable", (503,), "The engine's port refused the connection."),
    ErrorCode("engine_reset", (502,), "The engine closed the connection before it answered."),
    ErrorCode("engine_disconnected", (502,), "The engine's connection was lost mid-response (also a stream's "
              "final event)."),
    ErrorCode("upstream_timeout", (504,), "The engine sent nothing within the first-byte, idle or total timeout "
              "(also a stream's final event)."),
    ErrorCode("upstream_auth", (502,), "The engine refused the gateway's credentials (e.g. a wrong "
              "`api_key_env` for an external URL)."),
    ErrorCode("upstream_malformed", (), "Stream event: the engine sent an event that is not JSON."),
    ErrorCode("engine_error", (500, 502), "Any other engine failure, when the engine gave no code of its own."),
    ErrorCode("server_error", (), "Responses stream `error` event: the engine failed and named no code."),
    ErrorCode("internal_error", (500,), "A bug in the gateway (the message names the exception; never a traceback)."),
)

CODES: frozenset[str] = frozenset(entry.code for entry in ERROR_CODES)
