"""/openapi.json as the gateway really behaves: the request models of the POST routes (the routes
parse their bodies themselves, so FastAPI cannot see them), every error status the gateway sends
with OpenAI's error shape, and no 422 (validation failures are 400 here)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from gateway.api.admin_keys import NewKey
from gateway.api.messages_translate import CountTokensRequest, MessagesRequest
from gateway.api.protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from gateway.api.responses_translate import ResponsesRequest
from gateway.api.tokenize import DetokenizeRequest, TokenizeRequest
from gateway.tenancy.access import required_access

REQUEST_MODELS: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/v1/embeddings": EmbeddingRequest,
    "/v1/responses": ResponsesRequest,
    "/v1/messages": MessagesRequest,
    "/v1/messages/count_tokens": CountTokensRequest,
    "/tokenize": TokenizeRequest,
    "/detokenize": DetokenizeRequest,
}
ADMIN_REQUEST_MODELS: dict[str, type[BaseModel]] = {"/admin/keys": NewKey}
"""Admin routes that parse a JSON body: documented with it, and with 400 (invalid) and 409 (name taken)."""
STREAMING = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"})
ANTHROPIC = "/v1/messages"  # its errors have Anthropic's shape

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
ANTHROPIC_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {"type": "object", "required": ["type", "message"],
                  "properties": {"type": {"type": "string"}, "message": {"type": "string"}}},
    },
}
WHY: dict[int, str] = {
    400: "Invalid request: bad JSON, a field out of range (`param` names it), unsupported by the engine, over the context",
    401: "Missing, wrong, revoked or expired API key (when keys are configured)",
    403: "The route needs a key with role admin (POST /admin/keys also while the gateway has no key at all)",
    409: "A key with that name exists (POST /admin/keys); a key is still active (POST /admin/auth/disable)",
    404: "Unknown model or route",
    408: "The request body did not arrive in time",
    413: "Request body over max_body_bytes",
    429: "The key's rate limit (rate_limit_exceeded) or budget (insufficient_quota), or the model's queue is full (Retry-After)",
    500: "Engine failure",
    502: "The engine broke the connection or answered 5xx",
    503: "Engine not ready, restarting or failed; the key store unreachable; or the gateway is draining (Retry-After)",
    504: "The engine did not answer in time",
}
GENERATION_ERRORS = (400, 401, 404, 408, 413, 429, 500, 502, 503, 504)
PROTECTED_ERRORS = (401, 503)  # other /v1 and /admin routes: key, drain
ANY_JSON: dict[str, Any] = {"application/json": {"schema": {}}}


def _errors(statuses: tuple[int, ...], schema: str = "ErrorResponse") -> dict[str, Any]:
    assert all(s in WHY for s in statuses)
    ref = {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}
    return {str(s): {"description": WHY[s], "content": ref} for s in statuses}


def _error_schema(path: str) -> str:
    return "AnthropicErrorResponse" if path.startswith(ANTHROPIC) else "ErrorResponse"


def _request_schemas(components: dict[str, Any]) -> None:
    for model in (*REQUEST_MODELS.values(), *ADMIN_REQUEST_MODELS.values()):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}", by_alias=True)
        components.update(schema.pop("$defs", {}))
        components[model.__name__] = schema


def build_openapi(app: FastAPI) -> dict[str, Any]:
    spec = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = spec.setdefault("components", {}).setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
    components["ErrorResponse"] = ERROR_SCHEMA
    components["AnthropicErrorResponse"] = ANTHROPIC_ERROR_SCHEMA
    _request_schemas(components)
    for path, operations in spec["paths"].items():
        for operation in operations.values():
            responses: dict[str, Any] = operation.setdefault("responses", {})
            if responses.pop("422", None) is not None:
                responses.update(_errors((400,)))  # a bad query or path parameter
            if path in REQUEST_MODELS:
                model = REQUEST_MODELS[path].__name__
                operation["requestBody"] = {
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model}"}}},
                }
                content = {**ANY_JSON, "text/event-stream": {"schema": {}}} if path in STREAMING else ANY_JSON
                responses["200"] = {"description": "The OpenAI response (an SSE stream when `stream` is true)",
                                    "content": content}
                responses.update(_errors(GENERATION_ERRORS, _error_schema(path)))
            elif required_access(path) in ("user", "admin"):
                responses.update(_errors(PROTECTED_ERRORS))
                if "{" in path:
                    responses.update(_errors((404,)))
            if required_access(path) == "admin":
                responses.update(_errors((403,)))
            if path in ADMIN_REQUEST_MODELS and "requestBody" not in operation and operation is operations.get("post"):
                model = ADMIN_REQUEST_MODELS[path].__name__
                operation["requestBody"] = {"required": True, "content": {"application/json": {
                    "schema": {"$ref": f"#/components/schemas/{model}"}}}}
                responses.update(_errors((400, 409)))
            if path == "/tokenizer_info":
                responses.update(_errors((400, 404, 429, 503)))
            if path == "/admin/auth/disable":
                responses.update(_errors((409,)))
            if path == "/metrics":
                responses["200"] = {"description": "Prometheus text exposition; OpenMetrics (with trace exemplars) "
                                                   "when the Accept header asks for application/openmetrics-text",
                                    "content": {"text/plain": {"schema": {"type": "string"}},
                                                "application/openmetrics-text": {"schema": {"type": "string"}}}}
                responses.update(_errors((401,)))  # when metrics_api_key is set
            if path == "/ready":
                responses["503"] = {"description": "Not every model is ready, or the gateway is draining",
                                    "content": ANY_JSON}
    return spec


def install_openapi(app: FastAPI) -> None:
    cache: dict[str, Any] = {}

    def openapi() -> dict[str, Any]:
        if "spec" not in cache:
            cache["spec"] = build_openapi(app)
        return cache["spec"]

    app.openapi = openapi  # type: ignore[method-assign]
