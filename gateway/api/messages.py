"""POST /v1/messages and /v1/messages/count_tokens (Anthropic), served by translation to chat on every engine."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.chat import check_chat
from gateway.api.messages_translate import (
    CountTokensDialect,
    CountTokensRequest,
    MessagesDialect,
    MessagesRequest,
    error_body,
    to_chat,
)
from gateway.api.modalities import check_modalities
from gateway.api.protocol import ResponseFormat
from gateway.api.refusals import refuse
from gateway.api.serving import generate, parse_body, resolve_backend

router = APIRouter()
PREFIX = "/v1/messages"
NAMES = {"tools": "tools", "response_format": "output_config.format", "tools.function": "", "tools.parameters": "input_schema"}


@router.post("/v1/messages")
async def messages(request: Request) -> Response:
    parsed, _ = await parse_body(request, MessagesRequest, refuse("messages"))
    body = to_chat(parsed)
    backend = resolve_backend(request, parsed.model, "chat")
    fmt = body.get("response_format")
    check_chat(backend, tools=body.get("tools"), response_format=ResponseFormat.model_validate(fmt) if fmt else None,
               names=NAMES, tool_choice=body.get("tool_choice"))
    check_modalities(backend, body["messages"], lambda _: "messages")
    return await generate(request, backend, "chat", body, True, MessagesDialect(parsed.model))


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request) -> Response:
    parsed, _ = await parse_body(request, CountTokensRequest, refuse("messages"))
    body = {**to_chat(parsed), "max_tokens": 1, "temperature": 0}
    body.pop("tool_choice", None)  # a forced tool would add a grammar, not prompt tokens
    backend = resolve_backend(request, parsed.model, "chat")
    check_chat(backend, tools=body.get("tools"), response_format=None, names=NAMES)
    check_modalities(backend, body["messages"], lambda _: "messages")
    return await generate(request, backend, "chat", body, False, CountTokensDialect())


class AnthropicDialectMiddleware:
    """Plain ASGI, on /v1/messages only: `x-api-key` is accepted as the key (as `Authorization: Bearer`),
    and every error leaves in Anthropic's shape, `{"type": "error", "error": {"type", "message"}}`,
    whoever raised it (auth, body limit, validation, routing, the engine)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(PREFIX):
            await self.app(scope, receive, send)
            return
        headers = list(scope.get("headers", []))
        names = {k for k, _ in headers}
        api_key = next((v for k, v in headers if k == b"x-api-key"), None)
        if api_key is not None and b"authorization" not in names:
            scope = {**scope, "headers": [*headers, (b"authorization", b"Bearer " + api_key)]}
        pending: Message | None = None
        chunks: list[bytes] = []

        async def reshape(message: Message) -> None:
            nonlocal pending
            if message["type"] == "http.response.start":
                content_type = dict(message.get("headers", [])).get(b"content-type", b"")
                if message["status"] >= 400 and content_type.startswith(b"application/json"):
                    pending = message
                    return
                await send(message)
                return
            if pending is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body = _anthropic_error(pending["status"], b"".join(chunks))
            headers = [(k, v) for k, v in pending.get("headers", []) if k != b"content-length"]
            await send({**pending, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, reshape)


def _anthropic_error(status: int, body: bytes) -> bytes:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict) and data.get("type") == "error":
        return body
    err = data.get("error") if isinstance(data, dict) else None
    message = err.get("message") if isinstance(err, dict) else None
    return orjson.dumps(error_body(status, str(message or body.decode(errors="replace") or "error")))
