"""Every engine's error shape -> OpenAI's `{"error": {...}}`, and the exception it becomes."""

from __future__ import annotations

import re
from http import HTTPStatus
from typing import Any

import orjson

from adapters.base import ClientRequestError, EngineError, StreamEvent
from adapters.error_codes import CONTEXT_LENGTH_EXCEEDED

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    501: "not_supported_error",
    503: "service_unavailable_error",
}
# Types an engine may send that are kept as they are (llama-server says unavailable_error while loading).
_OPENAI_TYPES = frozenset(_TYPE_BY_STATUS.values()) | {"server_error", "timeout_error", "unavailable_error"}
# How engines say a prompt is over the context (llama-server's type; vLLM, SGLang, TensorRT-LLM's messages).
_CONTEXT_TYPES = frozenset({"exceed_context_size_error"})
_CONTEXT_MESSAGE = re.compile(r"context (length|size|window)|maximum context|max_model_len|max_seq_len", re.IGNORECASE)


INPUT_REFUSED = re.compile(
    r"(image|audio|video|multimodal|media|file)\b.*\b(not supported|does not support)"
    r"|not supported by this model|is too large to process|exceeds? the (available )?context"
    r"|\binvalid (base64|image|audio|url|value|argument|param|json|request|grammar|schema)"
    r"|failed to (load|decode|download|parse) (the )?(image|audio|file|grammar|json schema)"
    r"|unsupported param|must not be empty|\bis required\b|must be (a|an) |cannot use both|only no echo"
    # llama-server's parse of the request's tools and messages (common/chat.cpp wraps every error of it
    # so, a wrong type included: "Failed to parse tools: [json.exception.type_error.302] type must be
    # string, but is number"), its tool-call history's arguments, a chat template's raise_exception
    # (older builds answer 500), a grammar with tools, tools on a server started without --jinja
    r"|^failed to parse (tools|messages|tool call arguments)\b|\bjinja exception\b|cannot specify (both|grammar)"
    r"|\b(tools|tool_choice) param requires --jinja",
    re.IGNORECASE,
)
"""An engine's 5xx that says the client's input was at fault (llama-server answers these 500, from
the `std::runtime_error`s it throws on a request it cannot take): the client's error, never the engine's.
Only messages about the request itself: an engine failing on its own output or state stays its failure."""
_ECHOED = re.compile(r"; (tools|messages) = .*\Z", re.DOTALL)
"""llama-server appends the whole parsed field to the message (megabytes for a long tools list)."""
MESSAGE_MAX = 2000


def refuses_input(status: int, message: str) -> bool:
    """An engine error that is the client's input refused (a 5xx saying so, or 501 not supported), not a failure."""
    if status == 501:
        return True
    return status in (500, 502) and INPUT_REFUSED.search(message[:4 * MESSAGE_MAX]) is not None


_TOO_LONG = re.compile(r"is too large to process|exceeds? the (available )?context", re.IGNORECASE)


def _input_code(message: str) -> str | None:
    return "context_length_exceeded" if _TOO_LONG.search(message) else None


def error_type(status: int) -> str:
    """OpenAI's error `type` for an HTTP status: the one table, for the gateway's errors and relayed ones."""
    return _TYPE_BY_STATUS.get(status, "server_error" if status >= 500 else "invalid_request_error")


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return f"HTTP {status}"


def _param_from_loc(loc: Any) -> str | None:
    if isinstance(loc, list):
        parts = [str(p) for p in loc if p not in ("body", "query")]
        return ".".join(parts) or None
    return None


def normalise_error(status: int, raw: bytes | str | dict[str, Any] | None) -> dict[str, Any]:
    """Any engine's error body -> OpenAI's `{"error": {"message", "type", "param", "code"}}`."""
    obj: Any = raw
    if isinstance(raw, (bytes, str)):
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        try:
            obj = orjson.loads(text) if text.strip() else None
        except orjson.JSONDecodeError:
            obj = text.strip()[:2000] or None
    message: str | None = None
    etype: str | None = None
    param: str | None = None
    code: Any = None
    source: Any = obj
    if isinstance(obj, dict) and "error" in obj:
        source = obj["error"]  # nested (OpenAI, llama-server, vLLM) or bare string (MLX, 401s)
    elif isinstance(obj, dict) and "detail" in obj:
        detail = obj["detail"]  # FastAPI (TabbyAPI)
        if isinstance(detail, list) and detail and isinstance(detail[0], dict):
            first = detail[0]
            param = _param_from_loc(first.get("loc"))
            message = "; ".join(
                f"{_param_from_loc(d.get('loc')) or 'body'}: {d.get('msg', d)}" for d in detail if isinstance(d, dict)
            )
        else:
            source = detail
    if isinstance(source, dict):
        message = message or _text(source.get("message") or source.get("msg") or source.get("detail"))
        etype = _text(source.get("type"))
        param = param or _text(source.get("param"))
        code = source.get("code")
    elif source is not None and message is None:
        message = source if isinstance(source, str) else orjson.dumps(source).decode()
    if isinstance(code, int) and code == status:
        code = None  # llama-server repeats the status as code: no extra information
    if status == 400 and not isinstance(code, str) and (etype in _CONTEXT_TYPES or _CONTEXT_MESSAGE.search(message or "")):
        code = CONTEXT_LENGTH_EXCEEDED  # OpenAI's code for it, whatever the engine called it
    if etype not in _OPENAI_TYPES:
        etype = error_type(status)
    return {"error": {"message": message or _reason(status), "type": etype, "param": param, "code": code}}


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else str(value)


def error_exception(status: int, raw: bytes | str | dict[str, Any] | None, engine: str = "engine") -> Exception:
    """The exception an engine's error response becomes: the client's fault or the engine's."""
    err = normalise_error(status, raw)["error"]
    message: str = err["message"]
    code = err["code"] if err["code"] is None else str(err["code"])
    if status in (401, 403):
        return EngineError(f"{engine} rejected the gateway's credentials: {message}", 502, "upstream_auth")
    if status in (408, 504):
        return EngineError(f"{engine} timed out: {message}", 504, code or "upstream_timeout")
    if status in (503, 529):
        return EngineError(f"{engine} is unavailable: {message}", 503, code or "engine_unavailable")
    if 400 <= status < 500 and status != 499:
        return ClientRequestError(message, status, err["param"], code)
    if refuses_input(status, message):
        message = _ECHOED.sub("", message)[:MESSAGE_MAX]
        return ClientRequestError(f"{engine} cannot take this request: {message}", 400, err["param"],
                                  code or _input_code(message))
    return EngineError(f"{engine} error {status}: {message}", 502, code)


def stream_failure(data: bytes) -> Exception:
    """What an error event in an engine's stream counts as: the client's input refused, else the engine's failure."""
    try:
        err = normalise_error(500, data)["error"]
    except Exception:  # noqa: BLE001 - unreadable: the engine's failure
        err = {"message": ""}
    message = str(err.get("message") or "")
    if refuses_input(500, message):
        return ClientRequestError(_ECHOED.sub("", message)[:MESSAGE_MAX], 400, err.get("param"), _input_code(message))
    return EngineError("the engine's stream ended with an error", 502)


def error_event(message: str, code: str, etype: str = "server_error") -> StreamEvent:
    body = {"error": {"message": message, "type": etype, "param": None, "code": code}}
    return StreamEvent(orjson.dumps(body), is_error=True)
