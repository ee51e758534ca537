"""vLLM's native `POST /v1/responses` for the emulator: a stateless Response (or its typed SSE events,
`event: <type>` + `data:` as vLLM frames them) whose output is the emulator's usual `tok0 tok1 ...`."""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson
from aiohttp import web

from tests.emulators.tool_calls import ToolCallPlan, forced_responses_tool

Json = dict[str, Any]


def _words(value: Any) -> int:
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        return sum(_words(v) for v in value)
    if isinstance(value, dict):
        return sum(_words(value.get(k)) for k in ("content", "text", "output", "arguments"))
    return 0


def plan(body: Json, default_tokens: int) -> tuple[int, int, bool]:
    """(input tokens, output tokens, incomplete)."""
    limit = body.get("max_output_tokens")
    n = default_tokens if not isinstance(limit, int) else min(limit, default_tokens)
    prompt = _words(body.get("input")) + _words(body.get("instructions"))
    return prompt, n, isinstance(limit, int) and n >= limit


def call_item(rid: str, call: ToolCallPlan, status: str) -> Json:
    return {"type": "function_call", "id": "fc_" + rid[5:], "call_id": call.call_id, "name": call.name,
            "arguments": call.arguments if status == "completed" else "", "status": status}


def response(body: Json, model: str, rid: str, status: str, text: str | None, prompt: int, n: int,
             call: ToolCallPlan | None = None) -> Json:
    if call is not None and text is not None:
        output = [call_item(rid, call, "completed")]
    else:
        output = [] if text is None else [{"type": "message", "id": "msg_" + rid[5:], "status": "completed",
                                           "role": "assistant",
                                           "content": [{"type": "output_text", "text": text, "annotations": []}]}]
    usage = None if text is None else {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0},
                                       "output_tokens": n, "output_tokens_details": {"reasoning_tokens": 0},
                                       "total_tokens": prompt + n}
    # vLLM's ResponsesResponse echoes the request's settings and serialises its unset fields as null
    # (`user`, and `usage` until the response is done); its function tools carry no `strict`.
    return {"id": rid, "object": "response", "created_at": int(time.time()), "status": status, "model": model,
            "output": output, "usage": usage, "store": bool(body.get("store", True)),
            "previous_response_id": body.get("previous_response_id"), "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": body.get("instructions"), "metadata": body.get("metadata"),
            "parallel_tool_calls": body.get("parallel_tool_calls", True), "temperature": body.get("temperature", 1.0),
            "top_p": body.get("top_p", 1.0), "tool_choice": body.get("tool_choice", "auto"),
            "tools": [{k: v for k, v in t.items() if k != "strict"} for t in body.get("tools") or []],
            "max_output_tokens": body.get("max_output_tokens"), "user": body.get("user"), "truncation": "disabled",
            "text": body.get("text") or {"format": {"type": "text"}}, "reasoning": None}


async def serve(request: web.Request, body: Json, model: str, default_tokens: int, error_after: int | None) -> web.StreamResponse:
    if not isinstance(body.get("input"), (str, list)):
        return web.json_response({"object": "error", "message": "input is required", "type": "BadRequestError",
                                  "param": "input", "code": 400}, status=400)
    if body.get("previous_response_id"):  # the emulated vLLM keeps no state (store disabled, as by default)
        return web.json_response({"object": "error", "message": "Response with id "
                                  f"'{body['previous_response_id']}' not found.", "type": "NotFoundError",
                                  "param": None, "code": 404}, status=404)
    try:
        call = forced_responses_tool(body)
    except ValueError as exc:
        return web.json_response({"object": "error", "message": str(exc), "type": "BadRequestError",
                                  "param": "tool_choice", "code": 400}, status=400)
    prompt, n, incomplete = plan(body, default_tokens)
    rid = "resp_" + uuid.uuid4().hex
    text = "".join(f"tok{i} " if i < n - 1 else f"tok{i}" for i in range(n))
    status = "incomplete" if incomplete and call is None else "completed"
    if not body.get("stream"):
        return web.json_response(response(body, model, rid, status, text, prompt, n, call))
    out = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await out.prepare(request)
    seq = 0

    async def emit(kind: str, data: Json) -> None:
        nonlocal seq
        await out.write(b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data, "sequence_number": seq}) + b"\n\n")
        seq += 1

    item_id = "msg_" + rid[5:]
    shell = response(body, model, rid, "in_progress", None, prompt, n)
    await emit("response.created", {"response": shell})
    await emit("response.in_progress", {"response": shell})
    if call is not None:  # the call item, its arguments in fragments, as vLLM streams a forced call
        fc_id = "fc_" + rid[5:]
        await emit("response.output_item.added", {"output_index": 0, "item": call_item(rid, call, "in_progress")})
        for fragment in call.fragments():
            await emit("response.function_call_arguments.delta", {"item_id": fc_id, "output_index": 0, "delta": fragment})
        await emit("response.function_call_arguments.done", {"item_id": fc_id, "output_index": 0, "name": call.name,
                                                              "arguments": call.arguments})
        await emit("response.output_item.done", {"output_index": 0, "item": call_item(rid, call, "completed")})
        await emit("response.completed", {"response": response(body, model, rid, "completed", text, prompt, n, call)})
        await out.write_eof()
        return out
    await emit("response.output_item.added", {"output_index": 0, "item": {"type": "message", "id": item_id,
                                                                          "status": "in_progress", "role": "assistant", "content": []}})
    part = {"type": "output_text", "text": "", "annotations": []}
    await emit("response.content_part.added", {"item_id": item_id, "output_index": 0, "content_index": 0, "part": part})
    for i in range(n):
        if i == error_after:
            await emit("error", {"code": "server_error", "message": "injected generation error", "param": None})
            await emit("response.failed", {"response": {**shell, "status": "failed",
                                                        "error": {"code": "server_error", "message": "injected generation error"}}})
            await out.write_eof()
            return out
        delta = f"tok{i} " if i < n - 1 else f"tok{i}"
        await emit("response.output_text.delta", {"item_id": item_id, "output_index": 0, "content_index": 0,
                                                   "delta": delta, "logprobs": []})
    where = {"item_id": item_id, "output_index": 0, "content_index": 0}
    await emit("response.output_text.done", {**where, "text": text, "logprobs": []})
    await emit("response.content_part.done", {**where, "part": {**part, "text": text}})
    final = response(body, model, rid, status, text, prompt, n)
    await emit("response.output_item.done", {"output_index": 0, "item": final["output"][0]})
    await emit("response.completed" if status == "completed" else "response.incomplete", {"response": final})
    await out.write_eof()
    return out
