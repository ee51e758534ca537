"""Anthropic Messages <-> the chat form every adapter speaks: the request down, the message and its events up."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator
from starlette.responses import Response

from adapters.base import Completion, StreamEvent, Usage
from gateway.api.chat_reader import (
    ChatOutput,
    ChunkReader,
    TextDelta,
    ToolArgsDelta,
    ToolCall,
    ToolCallStart,
    error_message,
    new_id,
    read_completion,
)
from gateway.api.errors import APIError
from gateway.api.serving import CHAT

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use"}
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


class _Permissive(BaseModel):
    model_config = ConfigDict(extra="allow")


class TextBlock(_Permissive):
    type: Literal["text"]
    text: str


class ImageSource(_Permissive):
    type: Literal["base64", "url"]
    media_type: str | None = None
    data: str | None = None
    url: str | None = None


class ImageBlock(_Permissive):
    type: Literal["image"]
    source: ImageSource


class ToolUseBlock(_Permissive):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]


class ToolResultBlock(_Permissive):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[TextBlock | ImageBlock] = ""
    is_error: bool = False


class ThinkingBlock(_Permissive):
    type: Literal["thinking", "redacted_thinking"]


Block = Annotated[TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock, Field(discriminator="type")]
BLOCK: TypeAdapter[Any] = TypeAdapter(Block)


class Message(_Permissive):
    role: Literal["user", "assistant"]
    content: str | list[Block]

    @field_validator("content", mode="before")
    @classmethod
    def _blocks(cls, v: Any) -> Any:
        """One clear message for a malformed block (not pydantic's every-branch-of-the-union list)."""
        if not isinstance(v, list):
            return v
        blocks = []
        for j, raw in enumerate(v):
            try:
                blocks.append(BLOCK.validate_python(raw))
            except ValidationError as exc:
                first = exc.errors()[0]
                loc = first["loc"][1:] if first["loc"] and isinstance(raw, dict) and first["loc"][0] == raw.get("type") else first["loc"]
                where = ".".join(str(p) for p in loc)
                raise ValueError(f"content block {j}{' ' + where if where else ''}: {first['msg']}") from None
        return blocks


class Tool(_Permissive):
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any]


class ToolChoice(_Permissive):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None


class JSONFormat(_Permissive):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Permissive):
    format: JSONFormat | None = None


class CountTokensRequest(_Permissive):
    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    output_config: OutputConfig | None = None

    @field_validator("stop_sequences")
    @classmethod
    def _non_empty(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and any(not s for s in v):
            raise ValueError("stop sequences must not be empty strings")
        return v


def _text(blocks: str | list[TextBlock] | list[TextBlock | ImageBlock]) -> str:
    if isinstance(blocks, str):
        return blocks
    return "".join(b.text for b in blocks if isinstance(b, TextBlock))


def _image_part(block: ImageBlock) -> dict[str, Any]:
    src = block.source
    url = src.url if src.type == "url" else f"data:{src.media_type or 'image/png'};base64,{src.data or ''}"
    return {"type": "image_url", "image_url": {"url": url}}


def _user_messages(content: str | list[Any], index: int, issued: set[str]) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        if isinstance(block, ToolResultBlock):
            if block.tool_use_id not in issued:
                raise APIError(400, f"messages.{index}.content.{j}: tool_result for unknown tool_use id "
                                    f"`{block.tool_use_id}` (no earlier assistant tool_use has it)",
                               param=f"messages.{index}.content.{j}.tool_use_id")
            text = _text(block.content)
            out.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": f"Error: {text}" if block.is_error else text})
        elif isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
        elif isinstance(block, ImageBlock):
            parts.append(_image_part(block))
        elif isinstance(block, ToolUseBlock):
            raise APIError(400, f"messages.{index}.content.{j}: tool_use blocks belong to assistant messages",
                           param=f"messages.{index}.content.{j}")
    if parts:
        only_text = all(p["type"] == "text" for p in parts)
        out.append({"role": "user", "content": "".join(p["text"] for p in parts) if only_text else parts})
    return out


def _assistant_message(content: str | list[Any], issued: set[str]) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    text = "".join(b.text for b in content if isinstance(b, TextBlock))
    calls = []
    for block in content:
        if isinstance(block, ToolUseBlock):
            issued.add(block.id)
            calls.append({"id": block.id, "type": "function",
                          "function": {"name": block.name, "arguments": orjson.dumps(block.input).decode()}})
    message: dict[str, Any] = {"role": "assistant", "content": text}  # "" not None: many chat templates concatenate it
    if calls:
        message["tool_calls"] = calls
    return message


def chat_messages(req: CountTokensRequest) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    system = _text(req.system) if req.system is not None else ""
    if system:
        messages.append({"role": "system", "content": system})
    issued: set[str] = set()
    for i, m in enumerate(req.messages):
        if m.role == "assistant":
            messages.append(_assistant_message(m.content, issued))
        else:
            messages.extend(_user_messages(m.content, i, issued))
    return messages


def _tool_choice(choice: ToolChoice | None, tools: list[Tool] | None) -> str | dict[str, Any] | None:
    if choice is None:
        return None
    if choice.type == "tool":
        if not choice.name or not any(t.name == choice.name for t in tools or []):
            raise APIError(400, f"tool_choice names `{choice.name}`, which is not in tools", param="tool_choice.name",
                           code="invalid_value")
        return {"type": "function", "function": {"name": choice.name}}
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]


def to_chat(req: CountTokensRequest) -> dict[str, Any]:
    """The chat body for a Messages (or count_tokens) request; unknown Anthropic fields are not forwarded."""
    body: dict[str, Any] = {"model": req.model, "messages": chat_messages(req)}
    if req.tools:
        body["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                                            "parameters": t.input_schema}} for t in req.tools]
    choice = _tool_choice(req.tool_choice, req.tools)
    if choice is not None:
        body["tool_choice"] = choice
    if isinstance(req, MessagesRequest):
        body["max_tokens"] = req.max_tokens
        if req.stop_sequences:
            body["stop"] = req.stop_sequences
        fmt = req.output_config.format if req.output_config else None
        if fmt is not None:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt.schema_}}
        for key in ("temperature", "top_p", "top_k"):
            value = getattr(req, key)
            if value is not None:
                body[key] = value
        if req.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
    return body


def tool_input(call: ToolCall) -> dict[str, Any]:
    """A tool call's arguments as the object Anthropic's `input` must be; unparseable text is kept, not dropped."""
    try:
        value = orjson.loads(call.arguments or "{}")
    except orjson.JSONDecodeError:
        return {"_unparsed_arguments": call.arguments}
    return value if isinstance(value, dict) else {"_value": value}


def _usage(usage: Usage | None) -> dict[str, int]:
    usage = usage or Usage()
    return {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens}


def stop_reason(out: ChatOutput) -> str:
    """A tool call cut by the token limit is `max_tokens`, as Anthropic says it: not a `tool_use` to run."""
    if out.tool_calls and out.finish_reason != "length":
        return "tool_use"
    return STOP_REASONS.get(out.finish_reason or "stop", "end_turn")


def message_body(out: ChatOutput, model: str, message_id: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if out.text:
        content.append({"type": "text", "text": out.text})
    for call in out.tool_calls:
        content.append({"type": "tool_use", "id": call.id, "name": call.name, "input": tool_input(call)})
    return {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop_reason(out), "stop_sequence": None, "usage": _usage(out.usage)}


def error_body(status: int, message: str) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def _sse(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class MessagesWriter:
    """Chat chunks in, Anthropic's event sequence out: message_start, ping, then per content block
    content_block_start / content_block_delta... / content_block_stop, then message_delta, message_stop."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.id = new_id("msg")
        self.reader = ChunkReader()
        self.started = False
        self.block = -1  # index of the open content block; -1 = none open
        self.block_kind: tuple[str, int] | None = None  # ("text", 0) or ("tool", chat tool index)

    def _start(self) -> bytes:
        if self.started:
            return b""
        self.started = True
        message: dict[str, Any] = {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
                   "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}}
        return _sse("message_start", {"type": "message_start", "message": message}) + _sse("ping", {"type": "ping"})

    def _close(self) -> bytes:
        if self.block_kind is None:
            return b""
        self.block_kind = None
        return _sse("content_block_stop", {"type": "content_block_stop", "index": self.block})

    def _open(self, kind: tuple[str, int], block: dict[str, Any]) -> bytes:
        out = self._close()
        self.block += 1
        self.block_kind = kind
        return out + _sse("content_block_start", {"type": "content_block_start", "index": self.block, "content_block": block})

    def event(self, event: StreamEvent) -> bytes:
        out = self._start()
        if event.is_error:
            message, _ = error_message(event.data)
            return out + self.error(502, message)
        for part in self.reader.read(event):
            if isinstance(part, TextDelta):
                if self.block_kind != ("text", 0):
                    out += self._open(("text", 0), {"type": "text", "text": ""})
                delta = {"type": "text_delta", "text": part.text}
            elif isinstance(part, ToolCallStart):
                out += self._open(("tool", part.index), {"type": "tool_use", "id": part.call.id, "name": part.call.name, "input": {}})
                continue
            else:
                assert isinstance(part, ToolArgsDelta)
                if self.block_kind != ("tool", part.index):
                    continue  # a late fragment for a block already closed: the final input holds it
                delta = {"type": "input_json_delta", "partial_json": part.arguments}
            out += _sse("content_block_delta", {"type": "content_block_delta", "index": self.block, "delta": delta})
        return out

    def error(self, status: int, message: str) -> bytes:
        return _sse("error", error_body(status, message))

    async def end(self) -> bytes:
        out = self._start() + self._close()
        result = self.reader.output()
        delta = {"stop_reason": stop_reason(result), "stop_sequence": None}
        out += _sse("message_delta", {"type": "message_delta", "delta": delta, "usage": _usage(result.usage)})
        return out + _sse("message_stop", {"type": "message_stop"})


class MessagesDialect:
    def __init__(self, model: str) -> None:
        self.model = model

    async def complete(self, result: Completion) -> Response:
        if result.status >= 400:  # the engine's error as it came (on /v1/messages the middleware reshapes it)
            return await CHAT.complete(result)
        body = message_body(read_completion(result), self.model, new_id("msg"))
        return Response(orjson.dumps(body), media_type="application/json")

    def writer(self) -> MessagesWriter:
        return MessagesWriter(self.model)


class CountTokensDialect:
    """count_tokens runs the prompt through the engine for one token: the engine's own template and tokenizer count it."""

    async def complete(self, result: Completion) -> Response:
        if result.status >= 400:  # the engine's error as it came (on /v1/messages the middleware reshapes it)
            return await CHAT.complete(result)
        usage = read_completion(result).usage
        if usage is None:
            raise APIError(502, "the engine reported no usage, so the prompt cannot be counted")
        return Response(orjson.dumps({"input_tokens": usage.prompt_tokens}), media_type="application/json")

    def writer(self) -> MessagesWriter:
        raise AssertionError("count_tokens never streams")
