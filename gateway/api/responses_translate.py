"""OpenAI Responses <-> the chat form every adapter speaks: items down to chat messages, the Response and
its typed stream events up. Storing is the caller's (see responses.py); this module only builds objects."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from adapters.base import Completion, StreamEvent, Usage
from adapters.error_codes import response_error_code
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
from gateway.api.errors import APIError, error_payload
from gateway.api.serving import CHAT

ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = ("input_text", "output_text", "text", "summary_text")


class _Permissive(BaseModel):
    model_config = ConfigDict(extra="allow")


class TextFormat(_Permissive):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(_Permissive):
    format: TextFormat = TextFormat()


class ResponsesRequest(_Permissive):
    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    text: TextConfig | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    parallel_tool_calls: bool = True
    metadata: dict[str, str] | None = None
    user: str | None = None


# -- input items ---------------------------------------------------------------------------------


def input_items(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's input as a list of typed items with ids (what input_items lists and history keeps)."""
    if isinstance(req.input, str):
        if not req.input:
            raise APIError(400, "input must not be empty", param="input")
        raw: list[dict[str, Any]] = [{"role": "user", "content": req.input}]
    else:
        raw = req.input
    if not raw:
        raise APIError(400, "input must not be empty", param="input")
    items = []
    for i, item in enumerate(raw):
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise APIError(400, f"input[{i}].role must be one of {sorted(ROLES)}", param=f"input[{i}].role")
            content = item.get("content")
            if isinstance(content, str):
                content = [{"type": "output_text" if role == "assistant" else "input_text", "text": content}]
            if not isinstance(content, list) or not all(isinstance(p, dict) and "type" in p for p in content):
                raise APIError(400, f"input[{i}].content must be a string or a list of content parts", param=f"input[{i}].content")
            items.append({"type": "message", "id": item.get("id") or new_id("msg"), "role": role, "content": content,
                          "status": "completed"})
        elif kind == "function_call":
            for key in ("call_id", "name", "arguments"):
                if not isinstance(item.get(key), str):
                    raise APIError(400, f"input[{i}].{key} must be a string", param=f"input[{i}].{key}")
            items.append({**item, "id": item.get("id") or new_id("fc"), "status": item.get("status") or "completed"})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise APIError(400, f"input[{i}].call_id must be a string", param=f"input[{i}].call_id")
            output = item.get("output")
            if not isinstance(output, (str, list)):
                raise APIError(400, f"input[{i}].output must be a string", param=f"input[{i}].output")
            items.append({**item, "id": item.get("id") or new_id("fco"), "status": item.get("status") or "completed"})
        elif kind == "reasoning":
            continue  # reasoning items from other models carry nothing these engines can use
        else:
            raise APIError(400, f"input[{i}]: item type `{kind}` is not supported (message, function_call, "
                                "function_call_output)", param=f"input[{i}].type")
    return items


def _text_of(content: Any) -> tuple[str, list[dict[str, Any]]]:
    """A message's content as text, and as chat content parts when it holds an image."""
    if isinstance(content, str):
        return content, []
    text = ""
    parts: list[dict[str, Any]] = []
    for part in content:
        if part.get("type") in TEXT_PARTS:
            text += str(part.get("text") or "")
            parts.append({"type": "text", "text": str(part.get("text") or "")})
        elif part.get("type") == "input_image" and part.get("image_url"):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
    return text, parts if any(p["type"] == "image_url" for p in parts) else []


def chat_messages(instructions: str | None, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Items to chat messages; a function_call_output must answer a function_call seen before it."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    calls: set[str] = set()
    for item in history:
        if item["type"] == "message":
            text, parts = _text_of(item["content"])
            messages.append({"role": ROLES[item["role"]], "content": parts or text})
        elif item["type"] == "function_call":
            calls.add(item["call_id"])
            call = {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif item["type"] == "function_call_output":
            if item["call_id"] not in calls:
                raise APIError(400, f"No tool call found for function call output with call_id {item['call_id']}.",
                               param="input", code="invalid_function_call_output")
            output = item["output"]
            text = output if isinstance(output, str) else _text_of(output)[0]
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
    return messages


def _tools(req: ResponsesRequest) -> list[dict[str, Any]] | None:
    if not req.tools:
        return None
    tools = []
    for i, tool in enumerate(req.tools):
        if tool.get("type") != "function" or not tool.get("name"):
            raise APIError(400, f"tools[{i}]: only function tools (type `function` with a name) are supported, "
                                f"not `{tool.get('type')}`", param=f"tools[{i}].type", code="invalid_value")
        fn = {"name": tool["name"], "description": tool.get("description") or "",
              "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}
        tools.append({"type": "function", "function": fn})
    return tools


def _tool_choice(choice: str | dict[str, Any] | None, tools: list[dict[str, Any]] | None) -> str | dict[str, Any] | None:
    if choice is None or isinstance(choice, str):
        if choice not in (None, "auto", "none", "required"):
            raise APIError(400, "tool_choice must be auto, none, required or a function", param="tool_choice",
                           code="invalid_value")
        return choice
    name = choice.get("name")
    if choice.get("type") != "function" or not any(t["function"]["name"] == name for t in tools or []):
        raise APIError(400, f"tool_choice names function `{name}`, which is not in tools", param="tool_choice",
                       code="invalid_value")
    return {"type": "function", "function": {"name": name}}


def response_format(req: ResponsesRequest) -> dict[str, Any] | None:
    fmt = req.text.format if req.text else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if not isinstance(fmt.schema_, dict):
        raise APIError(400, "text.format.schema must be a JSON schema object", param="text.format.schema",
                       code="invalid_json_schema")
    return {"type": "json_schema", "json_schema": {"name": fmt.name or "output", "schema": fmt.schema_,
                                                    "strict": bool(fmt.strict)}}


def to_chat(req: ResponsesRequest, history: list[dict[str, Any]]) -> dict[str, Any]:
    body: dict[str, Any] = {"model": req.model, "messages": chat_messages(req.instructions, history)}
    tools = _tools(req)
    if tools:
        body["tools"] = tools
    choice = _tool_choice(req.tool_choice, tools)
    if choice is not None:
        body["tool_choice"] = choice
    fmt = response_format(req)
    if fmt is not None:
        body["response_format"] = fmt
    if req.max_output_tokens is not None:
        body["max_tokens"] = req.max_output_tokens
    for key in ("temperature", "top_p"):
        if getattr(req, key) is not None:
            body[key] = getattr(req, key)
    if req.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


# -- the Response object -------------------------------------------------------------------------


def usage_body(usage: Usage | None) -> dict[str, Any]:
    usage = usage or Usage()
    return {"input_tokens": usage.prompt_tokens, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": usage.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.total_tokens}


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [text_part(text)] if status != "in_progress" else []}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(item_id: str, call: ToolCall, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call.id, "name": call.name,
            "arguments": call.arguments if status != "in_progress" else "", "status": status}


def echoed_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The request's tools as a Response echoes them: a function tool always carries `strict` and
    `parameters` (null when the client sent none; the spec requires both keys)."""
    return [{**tool, "strict": tool.get("strict"), "parameters": tool.get("parameters")}
            if tool.get("type") == "function" else tool for tool in tools or []]


def mend_response(response: dict[str, Any]) -> None:
    """An engine's own Response object in the spec's shape: no null `user`/`usage` (absent instead),
    `cache_write_tokens` in the usage, `strict` on echoed function tools."""
    for key in ("user", "usage"):
        if key in response and response[key] is None:
            del response[key]
    details = (response.get("usage") or {}).get("input_tokens_details")
    if isinstance(details, dict):
        details.setdefault("cached_tokens", 0)
        details.setdefault("cache_write_tokens", 0)
    if isinstance(response.get("tools"), list):
        response["tools"] = echoed_tools(response["tools"])
    for item in response.get("output") or ():
        mend_item(item)


def mend_item(item: dict[str, Any] | None) -> bool:
    """An output message's text parts carry `annotations` and `logprobs` (lists; required by the spec)."""
    if not isinstance(item, dict) or item.get("type") != "message":
        return False
    changed = False
    for part in item.get("content") or ():
        changed = mend_part(part) or changed
    return changed


def mend_part(part: dict[str, Any] | None) -> bool:
    changed = False
    if isinstance(part, dict) and part.get("type") == "output_text":
        for key in ("annotations", "logprobs"):
            if not isinstance(part.get(key), list):
                part[key] = []
                changed = True
    return changed


class ResponseShell:
    """One Response's fixed fields (id, echo of the request) and the builder of its states."""

    def __init__(self, req: ResponsesRequest) -> None:
        self.req = req
        self.id = new_id("resp")
        self.created_at = int(time.time())

    def body(self, status: str, output: list[dict[str, Any]], usage: Usage | None = None,
             incomplete: str | None = None, error: dict[str, Any] | None = None) -> dict[str, Any]:
        req = self.req
        fmt = req.text.format.model_dump(by_alias=True, exclude_none=True) if req.text else {"type": "text"}
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "error": error, "incomplete_details": {"reason": incomplete} if incomplete else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens, "model": req.model,
            "output": output, "parallel_tool_calls": req.parallel_tool_calls,
            "previous_response_id": req.previous_response_id, "reasoning": {"effort": None, "summary": None},
            "store": req.store, "temperature": req.temperature if req.temperature is not None else 1.0,
            "text": {"format": fmt}, "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
            "tools": echoed_tools(req.tools), "top_p": req.top_p if req.top_p is not None else 1.0,
            "truncation": "disabled", "metadata": req.metadata or {},
            **({"usage": usage_body(usage)} if status != "in_progress" else {}),
            **({"user": req.user} if req.user is not None else {}),
        }

    def finished(self, out: ChatOutput, item_ids: tuple[str, list[str]] | None = None) -> dict[str, Any]:
        message_id, call_ids = item_ids or (new_id("msg"), [new_id("fc") for _ in out.tool_calls])
        incomplete = "max_output_tokens" if out.finish_reason == "length" else None
        status = "incomplete" if incomplete else "completed"
        output = [message_item(message_id, out.text, status)] if out.text or not out.tool_calls else []
        output += [call_item(cid, call, status) for cid, call in zip(call_ids, out.tool_calls)]
        return self.body(status, output, out.usage, incomplete)


OnDone = Callable[[dict[str, Any]], Awaitable[None]]


class ResponsesWriter:
    """Chat chunks in, the Responses typed event sequence out, each with its sequence_number:
    response.created, response.in_progress; per output item output_item.added, (content_part.added,
    output_text.delta..., output_text.done, content_part.done | function_call_arguments.delta...,
    function_call_arguments.done), output_item.done; then response.completed (or .incomplete)."""

    def __init__(self, shell: ResponseShell, on_done: OnDone) -> None:
        self.shell = shell
        self.on_done = on_done
        self.reader = ChunkReader()
        self.seq = 0
        self.started = False
        self.index = -1  # output_index of the open item
        self.open: tuple[str, int] | None = None  # ("message", 0) or ("call", chat tool index)
        self.message_id = new_id("msg")
        self.call_ids: dict[int, str] = {}

    def _sse(self, kind: str, data: dict[str, Any]) -> bytes:
        data = {"type": kind, **data, "sequence_number": self.seq}
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    def _start(self) -> bytes:
        if self.started:
            return b""
        self.started = True
        shell = self.shell.body("in_progress", [])
        return self._sse("response.created", {"response": shell}) + self._sse("response.in_progress", {"response": shell})

    def _close(self, status: str = "completed") -> bytes:
        if self.open is None:
            return b""
        kind, tool_index = self.open
        self.open = None
        where = {"output_index": self.index}
        if kind == "message":
            text = self.reader.text
            ids = {"item_id": self.message_id, **where, "content_index": 0}
            return (self._sse("response.output_text.done", {**ids, "text": text, "logprobs": []})
                    + self._sse("response.content_part.done", {**ids, "part": text_part(text)})
                    + self._sse("response.output_item.done", {**where, "item": message_item(self.message_id, text, status)}))
        call = self.reader.calls[tool_index]
        item_id = self.call_ids[tool_index]
        return (self._sse("response.function_call_arguments.done", {"item_id": item_id, **where, "name": call.name,
                                                                    "arguments": call.arguments})
                + self._sse("response.output_item.done", {**where, "item": call_item(item_id, call, status)}))

    def _open_message(self) -> bytes:
        out = self._close()
        self.index += 1
        self.open = ("message", 0)
        where = {"output_index": self.index}
        return (out + self._sse("response.output_item.added", {**where, "item": message_item(self.message_id, "", "in_progress")})
                + self._sse("response.content_part.added", {"item_id": self.message_id, **where, "content_index": 0,
                                                             "part": text_part("")}))

    def _text_delta(self, text: str) -> bytes:
        return self._sse("response.output_text.delta", {"item_id": self.message_id, "output_index": self.index,
                                                        "content_index": 0, "delta": text, "logprobs": []})

    def event(self, event: StreamEvent) -> bytes:
        out = self._start()
        if event.is_error:
            message, code = error_message(event.data)
            return out + self._failed(message, code)
        for part in self.reader.read(event):
            if isinstance(part, TextDelta):
                if self.open != ("message", 0):
                    out += self._open_message()
                out += self._text_delta(part.text)
            elif isinstance(part, ToolCallStart):
                out += self._close()
                self.index += 1
                self.open = ("call", part.index)
                item_id = self.call_ids[part.index] = new_id("fc")
                out += self._sse("response.output_item.added", {"output_index": self.index,
                                                                 "item": call_item(item_id, part.call, "in_progress")})
            elif isinstance(part, ToolArgsDelta) and self.open == ("call", part.index):
                out += self._sse("response.function_call_arguments.delta", {"item_id": self.call_ids[part.index],
                                                                            "output_index": self.index, "delta": part.arguments})
        return out

    def _failed(self, message: str, code: str | None, status: int = 500) -> bytes:
        error = {"code": response_error_code(code, status), "message": message}
        return (self._sse("error", {"code": code or error["code"], "message": message, "param": None})
                + self._sse("response.failed", {"response": self.shell.body("failed", [], error=error)}))

    def error(self, status: int, message: str) -> bytes:
        return self._start() + self._failed(message, None, status)

    async def end(self) -> bytes:
        out = self._start()
        if self.index < 0 and not self.reader.calls:  # nothing generated: still one (empty) message item
            out += self._open_message()
        result = self.reader.output()
        out += self._close("incomplete" if result.finish_reason == "length" else "completed")  # the last item was cut
        calls = [self.call_ids.get(i) or new_id("fc") for i in sorted(self.reader.calls)]
        body = self.shell.finished(result, (self.message_id, calls))
        await self.on_done(body)
        kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
        return out + self._sse(kind, {"response": body})


class ResponsesDialect:
    def __init__(self, shell: ResponseShell, on_done: OnDone) -> None:
        self.shell = shell
        self.on_done = on_done

    async def complete(self, result: Completion) -> Response:
        if result.status >= 400:  # the engine's error as it came (on /v1/messages the middleware reshapes it)
            return await CHAT.complete(result)
        body = self.shell.finished(read_completion(result))
        await self.on_done(body)
        return Response(orjson.dumps(body), media_type="application/json")

    def writer(self) -> ResponsesWriter:
        return ResponsesWriter(self.shell, self.on_done)


# -- native pass-through (engines that serve /v1/responses themselves) ---------------------------


def native_body(raw: dict[str, Any], history: list[dict[str, Any]]) -> dict[str, Any]:
    """The client's body for the engine's own /v1/responses, made stateless: the gateway resolved
    previous_response_id into the full item history and stores the result itself."""
    body = {k: v for k, v in raw.items() if k not in ("previous_response_id", "store")}
    return {**body, "input": history, "store": False}


class NativeResponsesWriter:
    """The engine's own Responses events, passed through with `event:` lines; the client's `store` and
    `previous_response_id` put back on each Response object; the final one is stored."""

    def __init__(self, req: ResponsesRequest, on_done: OnDone) -> None:
        self.req = req
        self.on_done = on_done
        self.final: dict[str, Any] | None = None
        self.next_seq = 0

    def restore(self, response: dict[str, Any]) -> None:
        mend_response(response)
        response["store"] = self.req.store
        response["previous_response_id"] = self.req.previous_response_id

    def event(self, event: StreamEvent) -> bytes:
        if not event.data:
            return b""
        obj = orjson.loads(event.data)
        kind = obj.get("type") if isinstance(obj, dict) else None
        if not isinstance(kind, str) or "sequence_number" not in obj:  # the relay's own error (engine lost)
            message, code = error_message(event.data)
            return self.error(502, message, code)
        self.next_seq = int(obj["sequence_number"]) + 1
        data = event.data
        if isinstance(obj.get("response"), dict):
            self.restore(obj["response"])
            if kind in ("response.completed", "response.incomplete"):
                self.final = obj["response"]
            data = orjson.dumps(obj)
        elif mend_item(obj.get("item")) or mend_part(obj.get("part")):
            data = orjson.dumps(obj)
        return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"

    def error(self, status: int, message: str, code: str | None = None) -> bytes:
        data = {"type": "error", "code": code or error_payload(status, message)["error"]["type"], "message": message,
                "param": None, "sequence_number": self.next_seq}
        self.next_seq += 1
        return b"event: error\ndata: " + orjson.dumps(data) + b"\n\n"

    async def end(self) -> bytes:
        if self.final is not None:
            await self.on_done(self.final)
        return b""


class NativeResponsesDialect:
    def __init__(self, req: ResponsesRequest, on_done: OnDone) -> None:
        self.req = req
        self.on_done = on_done

    async def complete(self, result: Completion) -> Response:
        if result.status >= 400:  # the engine's error as it came (on /v1/messages the middleware reshapes it)
            return await CHAT.complete(result)
        body = orjson.loads(result.body) if isinstance(result.body, bytes) else dict(result.body)
        NativeResponsesWriter(self.req, self.on_done).restore(body)
        await self.on_done(body)
        return Response(orjson.dumps(body), media_type="application/json")

    def writer(self) -> NativeResponsesWriter:
        return NativeResponsesWriter(self.req, self.on_done)
