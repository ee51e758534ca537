"""Span attributes from what the gateway already holds: pure functions, table-tested.

Names follow the OpenTelemetry semantic conventions (HTTP server spans; GenAI client spans, semconv
1.37+, with the older `gen_ai.system` kept beside `gen_ai.provider.name` for backends that still read it);
the gateway's own facts are `enginegate.*`. No key, key hash or secret is ever an attribute."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from adapters.base import Usage

AttributeValue = str | bool | int | float | Sequence[str]
Attributes = dict[str, AttributeValue]
STOP_SEQUENCES = 4
STOP_CHARS = 64
"""gen_ai.request.stop_sequences keeps at most this many, each cut to this many characters."""

OPERATION_NAMES: Mapping[str, str] = {
    "chat": "chat", "responses": "chat", "completions": "text_completion", "embeddings": "embeddings",
}
"""gen_ai.operation.name of each gateway operation (the Responses and Messages APIs run as chat)."""

_REQUEST_PARAMS: tuple[tuple[str, str, type | tuple[type, ...]], ...] = (
    ("temperature", "gen_ai.request.temperature", (int, float)),
    ("top_p", "gen_ai.request.top_p", (int, float)),
    ("top_k", "gen_ai.request.top_k", (int, float)),
    ("frequency_penalty", "gen_ai.request.frequency_penalty", (int, float)),
    ("presence_penalty", "gen_ai.request.presence_penalty", (int, float)),
    ("seed", "gen_ai.request.seed", int),
    ("n", "gen_ai.request.choice.count", int),
)


def _number(value: Any, kinds: type | tuple[type, ...]) -> bool:
    return isinstance(value, kinds) and not isinstance(value, bool)


def request_attributes(operation: str, engine: str, model: str, body: Mapping[str, Any]) -> Attributes:
    """What the attempt asks the engine for; only parameters the client set, of the type OpenAI defines."""
    attrs: Attributes = {
        "gen_ai.operation.name": OPERATION_NAMES.get(operation, operation),
        "gen_ai.provider.name": engine,
        "gen_ai.system": engine,
        "gen_ai.request.model": model,
    }
    for field, name, kinds in _REQUEST_PARAMS:
        value = body.get(field)
        if _number(value, kinds):
            attrs[name] = value
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if _number(max_tokens, int):
        attrs["gen_ai.request.max_tokens"] = max_tokens
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if isinstance(stop, list) and stop and all(isinstance(s, str) for s in stop):
        # the client's text in a span every tenant's traces share: OpenAI's four at most, each cut short
        attrs["gen_ai.request.stop_sequences"] = tuple(s[:STOP_CHARS] for s in stop[:STOP_SEQUENCES])
    if body.get("stream") is True:
        attrs["enginegate.stream"] = True
    return attrs


def usage_attributes(usage: Usage | None) -> Attributes:
    if usage is None:
        return {}
    attrs: Attributes = {
        "gen_ai.usage.input_tokens": usage.prompt_tokens,
        "gen_ai.usage.output_tokens": usage.completion_tokens,
    }
    if usage.cached_tokens is not None:
        attrs["gen_ai.usage.cache_read.input_tokens"] = usage.cached_tokens
    if usage.prefill_seconds is not None:
        attrs["enginegate.engine.prefill_ms"] = round(usage.prefill_seconds * 1000, 3)
    return attrs


def response_attributes(body: Mapping[str, Any] | bytes | None) -> Attributes:
    """gen_ai.response.{id,model,finish_reasons} of an OpenAI response object (or its JSON bytes)."""
    if isinstance(body, bytes):
        try:
            body = orjson.loads(body)
        except orjson.JSONDecodeError:
            return {}
    if not isinstance(body, Mapping):
        return {}
    attrs: Attributes = {}
    if isinstance(body.get("id"), str):
        attrs["gen_ai.response.id"] = body["id"]
    if isinstance(body.get("model"), str):
        attrs["gen_ai.response.model"] = body["model"]
    reasons = tuple(c["finish_reason"] for c in body.get("choices") or ()
                    if isinstance(c, Mapping) and isinstance(c.get("finish_reason"), str))
    if reasons:
        attrs["gen_ai.response.finish_reasons"] = reasons
    return attrs


def chunk_model(data: bytes) -> str | None:
    """The `model` of a stream chunk's JSON (the response model of a stream)."""
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    model = chunk.get("model") if isinstance(chunk, dict) else None
    return model if isinstance(model, str) else None


def input_messages(body: Mapping[str, Any]) -> str | None:
    """The prompt as JSON (only when content capture is opted in)."""
    prompt = body.get("messages", body.get("prompt", body.get("input")))
    return orjson.dumps(prompt).decode() if prompt is not None else None


def output_messages(body: Mapping[str, Any] | bytes | None) -> str | None:
    if isinstance(body, bytes):
        try:
            body = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
    if not isinstance(body, Mapping) or not isinstance(body.get("choices"), list):
        return None
    out = [c.get("message", {"content": c.get("text")}) for c in body["choices"] if isinstance(c, Mapping)]
    return orjson.dumps(out).decode()


def http_server_attributes(scope: Mapping[str, Any]) -> Attributes:
    attrs: Attributes = {
        "http.request.method": scope.get("method", "GET"),
        "url.path": scope.get("path", "/"),
        "url.scheme": scope.get("scheme", "http"),
    }
    server = scope.get("server")
    if server:
        attrs["server.address"], attrs["server.port"] = str(server[0]), int(server[1] or 0)
    client = scope.get("client")
    if client:
        attrs["client.address"] = str(client[0])
    for key, value in scope.get("headers", ()):
        if key == b"user-agent":
            attrs["user_agent.original"] = value.decode("latin-1")[:256]
            break
    return attrs


def route_of(scope: Mapping[str, Any], hot_paths: frozenset[str]) -> str | None:
    """http.route: the matched route's template (FastAPI's), or the exact path of a hot route."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    if isinstance(path, str):
        return path
    return scope.get("path") if scope.get("path") in hot_paths else None
