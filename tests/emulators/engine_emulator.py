"""A fast, configurable fake of an engine's OpenAI-compatible server, run as a real process.

    python -m tests.emulators.engine_emulator --style vllm --port 8000 [--ttft-ms 50 --itl-ms 10 ...]

Output is deterministic: completion token i is the word ``tok<i>`` (joined by spaces), the
completion has min(max_tokens, --tokens) tokens (``ignore_eos`` makes it exactly max_tokens,
``min_tokens`` raises it), and prompt tokens are the whitespace-separated words of every
message's text. Once ready it prints ``emulator ready on http://127.0.0.1:P style=S``.

Resuming (so a cut stream can be continued and line up with the uncut one): a chat request with
``continue_final_message: true`` continues its last message, which must be the assistant's (else 400;
an explicit ``add_generation_prompt: true`` with it is vLLM's 400 too): its token i is
``tok<offset+i>``, offset = the words of that message. A completions prompt whose last word is
``tok<N>`` continues at ``tok<N+1>``. Usage and ``max_tokens`` count only the new tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import hashlib
import json
import os
import random
import re
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from tests.emulators import responses_api
from tests.emulators.tool_calls import ToolCallPlan, forced_tool
from tests.emulators.vllm_lora import VllmLoras
from tests.emulators.emulator_metrics import EmulatorMetrics
from tests.emulators.styles import STYLES, ErrorReply, Json, Style, get_style

GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings"})


@dataclass(frozen=True)
class Config:
    style: str
    host: str
    port: int
    model: str
    tokens: int
    max_model_len: int
    api_key: str | None
    startup_delay: float
    ttft: float
    itl: float
    crash_after: int | None
    stall_after: int | None
    malformed_after: int | None
    error_after: int | None
    error_rate: float
    seed: int
    fail_status: int | None
    parallel: int
    metrics: bool
    embedding_dim: int
    no_usage: bool
    close_after_stream: bool
    models_503_while_loading: bool
    spawn_child: bool = False
    worker_registration: str | None = None
    worker_warmup: float = 0.0
    record_requests: str | None = None
    speculative_tokens: int = 0
    """vLLM's --speculative-config num_speculative_tokens (0: no speculation, no spec_decode metrics)."""
    prefill_per_token: float = 0.0
    """Seconds of prefill per prompt token, added to the ttft (a long prompt's first token comes later)."""
    lora_modules: tuple[str, ...] | None = None
    """vllm: --enable-lora's `--lora-modules name=path` (None: LoRA not enabled; tests/emulators/vllm_lora.py)."""
    lora_load: float = 0.0
    """Seconds a runtime adapter load takes."""


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def count_words(value: Any) -> int:
    """Prompt 'tokens': words of text, one per token id, recursing through lists and parts."""
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, int) and not isinstance(value, bool):
        return 1
    if isinstance(value, list):
        return sum(count_words(v) for v in value)
    if isinstance(value, dict):
        if value.get("type", "text") == "text" and "text" in value:
            return count_words(value["text"])
        if "content" in value:
            return count_words(value["content"])
    return 0


def token_text(i: int) -> str:
    return f"tok{i}" if i == 0 else f" tok{i}"


EMULATED_TOKEN = re.compile(r"tok(\d+)")


def continuation_offset(body: Json, chat: bool) -> int:
    """The index the first new token gets: past the final assistant message (chat's
    `continue_final_message`) or past a prompt's last ``tok<N>`` word (completions); 0 otherwise."""
    if not chat:
        prompt = body.get("prompt")
        words = prompt.split() if isinstance(prompt, str) else []
        match = EMULATED_TOKEN.fullmatch(words[-1]) if words else None
        return int(match.group(1)) + 1 if match else 0
    if not body.get("continue_final_message"):
        return 0
    if body.get("add_generation_prompt") is True:
        raise BadRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    last = body["messages"][-1]
    if not isinstance(last, dict) or last.get("role") != "assistant":
        raise BadRequest("continue_final_message is set but the last message is not an assistant message",
                         param="messages")
    return count_words(last.get("content"))


def _positive_int(body: Json, key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadRequest(f"{key} must be a non-negative integer, got {value!r}", param=key)
    return value


@dataclass(frozen=True)
class Plan:
    """What one generation request will produce."""

    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    stream: bool
    include_usage: bool
    max_tokens: int | None  # as requested; the context check uses it, as engines do
    tool: ToolCallPlan | None = None
    n: int = 1
    """Choices per request (`n`): each the same text."""
    service_tier: str | None = None
    """The tier the response reports (as OpenAI's: the one it was served at), when the request named one."""
    model: str = ""
    """The name the answer carries (a LoRA adapter's own on vLLM; the served model's otherwise)."""
    offset: int = 0
    """The first new token's index (a continued message or prompt): the tokens are tok<offset+i>."""


def plan_generation(body: Json, chat: bool, default_tokens: int) -> Plan:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list", param="messages")
        prompt_tokens = sum(count_words(m.get("content")) for m in messages if isinstance(m, dict))
    else:
        if "prompt" not in body:
            raise BadRequest("prompt is required", param="prompt")
        prompt_tokens = count_words(body["prompt"])
    max_tokens = _positive_int(body, "max_completion_tokens") if chat else None
    if max_tokens is None:
        max_tokens = _positive_int(body, "max_tokens")
    min_tokens = _positive_int(body, "min_tokens") or 0
    n = default_tokens if max_tokens is None else min(max_tokens, default_tokens)
    if body.get("ignore_eos") and max_tokens is not None:
        n = max_tokens
    n = max(n, min_tokens)
    if max_tokens is not None:
        n = min(n, max_tokens)
    finish = "length" if max_tokens is not None and n >= max_tokens else "stop"
    options = body.get("stream_options") or {}
    try:
        tool = forced_tool(body) if chat else None
    except ValueError as exc:
        raise BadRequest(str(exc), param="tool_choice") from exc
    if tool is not None:
        finish = "tool_calls"
    choices = _positive_int(body, "n") or 1
    tier = body.get("service_tier")
    served = None if not isinstance(tier, str) else "default" if tier == "auto" else tier
    return Plan(prompt_tokens, n, finish, bool(body.get("stream")), bool(options.get("include_usage")), max_tokens, tool,
                choices, served, offset=continuation_offset(body, chat))


def usage(prompt: int, completion: int) -> Json:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def json_response(reply: ErrorReply) -> web.Response:
    if reply.body is None:
        return web.Response(status=reply.status)
    return web.Response(status=reply.status, body=orjson.dumps(reply.body), content_type="application/json")


def embedding(text: str, dim: int) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return [(digest[i % len(digest)] - 127.5) / 127.5 for i in range(dim)]


class Emulator:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.style: Style = get_style(cfg.style)
        self.ready = asyncio.Event()
        self.rng = random.Random(cfg.seed)
        self.metrics = EmulatorMetrics(self.style, cfg.model, speculative=cfg.speculative_tokens > 0)
        self.slots = asyncio.Semaphore(cfg.parallel) if cfg.parallel > 0 else None
        self.processing = 0
        self.generation_failed = False
        self.created = int(time.time())
        self.loras = VllmLoras.from_modules(cfg.model, cfg.lora_modules, cfg.lora_load) if cfg.lora_modules is not None else None

    # --- application --------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.gate])
        r = app.router
        r.add_get("/v1/models", self.models)
        r.add_get("/models", self.models)
        r.add_post("/v1/chat/completions", self.chat)
        r.add_post("/v1/completions", self.completions)
        if self.style.embeddings:
            r.add_post("/v1/embeddings", self.embeddings)
        if self.loras is not None:
            self.loras.routes(r)
        r.add_get("/health", self.health)
        if self.style.metrics_path:
            r.add_get(self.style.metrics_path, self.prometheus)
        name = self.style.name
        if name == "llamacpp":
            r.add_get("/slots", self.slots_route)
            r.add_get("/props", self.props)
            r.add_get("/v1/health", self.health)
        if name in ("sglang", "trtllm"):
            r.add_get("/health_generate", self.health)
        if name == "sglang":
            r.add_get("/ready", self.health)
        if name == "trtllm":
            r.add_get("/metrics", self.trtllm_json_metrics)
        if name in ("trtllm", "vllm"):
            r.add_get("/version", self.version)
        if name in ("vllm", "trtllm"):  # both serve the Responses API themselves
            r.add_post("/v1/responses", self.responses)
        if name == "dynamo":
            r.add_get("/live", self.live)
        if name == "tabby":
            r.add_get("/v1/model", self.tabby_model)
        return app

    def error(self, status: int, message: str, param: str | None = None) -> web.Response:
        return json_response(self.style.error(status, message, param))

    @web.middleware
    async def gate(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        path = request.path
        loading = not self.ready.is_set()
        if loading and self.style.loading == "503" and (
            self.cfg.models_503_while_loading or path not in ("/v1/models", "/models")
        ):
            return self.error(503, "Loading model")
        if loading and self.style.loading == "warmup" and path in ("/health", "/health_generate", "/ready"):
            return web.Response(status=503)
        if loading and self.style.loading == "models_empty" and path in GENERATION_PATHS:
            return web.Response(status=404)  # Dynamo: no worker yet, a bare 404
        if self.cfg.api_key and path not in self.style.public_paths and not self.authorized(request):
            return json_response(self.style.auth_error())
        try:
            return await handler(request)
        except web.HTTPNotFound:
            return self.error(404, f"Not Found: {path}")
        except web.HTTPMethodNotAllowed:
            return self.error(405, f"Method Not Allowed: {request.method} {path}")

    def authorized(self, request: web.Request) -> bool:
        expected = self.cfg.api_key
        if request.headers.get("Authorization", "") == f"Bearer {expected}":
            return True
        return self.style.accepts_x_api_key and request.headers.get("x-api-key") == expected

    # --- plain routes -------------------------------------------------------------------
    def worker(self) -> str:
        """Dynamo frontend with a registration file: 'absent' (no live worker), 'warming' or 'up'."""
        path = self.cfg.worker_registration
        if path is None:
            return "up"
        try:
            pid = int(open(path).read().split()[1])
            age = time.time() - os.stat(path).st_mtime
            os.kill(pid, 0)
        except (OSError, IndexError, ValueError):
            return "absent"
        return "warming" if age < self.cfg.worker_warmup else "up"

    async def models(self, request: web.Request) -> web.Response:
        absent = self.worker() == "absent"
        entries = [] if absent or (not self.ready.is_set() and self.style.loading == "models_empty") else [
            self.style.model_entry(self.cfg.model, self.created, self.cfg.max_model_len),
            *(self.loras.entries(self.created) if self.loras is not None else ())
        ]
        return web.json_response(self.style.models_list(entries), dumps=lambda o: orjson.dumps(o).decode())

    async def health(self, request: web.Request) -> web.Response:
        name = self.style.name
        if name == "llamacpp" or name == "mlx":
            return web.json_response({"status": "ok"})
        if name == "tabby":
            if self.generation_failed:
                return web.json_response({"status": "unhealthy", "issues": ["generation error"]}, status=503)
            return web.json_response({"status": "healthy", "issues": []})
        if name == "dynamo":
            return web.json_response({"status": "healthy", "endpoints": [], "instances": []})
        return web.Response(status=200)

    async def live(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "live"})

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": f"emulated-{self.style.name}"})

    async def slots_route(self, request: web.Request) -> web.Response:
        n = max(self.cfg.parallel, 1)
        busy = self.processing
        return web.json_response([
            {"id": i, "n_ctx": self.cfg.max_model_len // n, "is_processing": i < busy, "speculative": False}
            for i in range(n)
        ])

    async def props(self, request: web.Request) -> web.Response:
        return web.json_response({"total_slots": max(self.cfg.parallel, 1), "model_path": self.cfg.model,
                                  "default_generation_settings": {"n_ctx": self.cfg.max_model_len}})

    async def tabby_model(self, request: web.Request) -> web.Response:
        return web.json_response({"id": self.cfg.model, "object": "model", "owned_by": "tabbyAPI",
                                  "parameters": {"max_seq_len": self.cfg.max_model_len}})

    async def prometheus(self, request: web.Request) -> web.Response:
        if self.style.metrics_need_flag and not self.cfg.metrics:
            return self.error(501, "This server does not support metrics endpoint. Start it with `--metrics`")
        return web.Response(body=self.metrics.render(), content_type="text/plain", charset="utf-8")

    async def trtllm_json_metrics(self, request: web.Request) -> web.Response:
        return web.json_response([{"iter": 0, "numActiveRequests": self.processing, "gpuMemUsage": 0,
                                   "kvCacheStats": {"usedNumBlocks": 0, "maxNumBlocks": 1024}}])

    # --- generation ---------------------------------------------------------------------
    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self.generate(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self.generate(request, chat=False)

    async def responses(self, request: web.Request) -> web.StreamResponse:
        body, early = await self.admit(request)
        if early is not None:
            return early
        return await responses_api.serve(request, body, self.answer_model(body), self.cfg.tokens, self.cfg.error_after)

    async def read_body(self, request: web.Request) -> Json:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"invalid JSON body: {exc}") from None
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        return body

    def injected_failure(self) -> web.Response | None:
        if self.cfg.fail_status is not None:
            return self.error(self.cfg.fail_status, f"injected failure (status {self.cfg.fail_status})")
        if self.cfg.error_rate > 0 and self.rng.random() < self.cfg.error_rate:
            return self.error(500, "injected internal error")
        return None

    async def admit(self, request: web.Request) -> tuple[Json, web.Response | None]:
        """Parse and validate a generation request; a non-None response ends it early."""
        try:
            body = await self.read_body(request)
        except BadRequest as exc:
            return {}, self.error(400, str(exc), exc.param)
        if self.cfg.record_requests:
            self.record_request(request, body)
        failure = self.injected_failure()
        if failure is not None:
            return body, failure
        model = body.get("model")
        if self.style.name in ("vllm", "dynamo") and model is not None and model != self.cfg.model \
                and not (self.loras is not None and self.loras.knows(str(model))):
            return body, self.error(404, f"The model `{model}` does not exist.", "model")
        if not self.ready.is_set():  # SGLang warmup and MLX loading: requests wait
            await self.ready.wait()
        if self.worker() != "up":  # the Dynamo frontend without a serving worker
            return body, self.error(503, "Service temporarily unavailable")
        return body, None

    def answer_model(self, body: Json) -> str:
        model = body.get("model")
        return str(model) if self.loras is not None and self.loras.knows(str(model)) else self.cfg.model

    def record_request(self, request: web.Request, body: Json) -> None:
        """One JSON line per generation request: path, headers (lower-cased names) and body, for tests
        that check what a client sent."""
        line = {"path": request.path, "headers": {k.lower(): v for k, v in request.headers.items()}, "body": body}
        with open(self.cfg.record_requests, "ab") as f:  # type: ignore[arg-type]
            f.write(orjson.dumps(line) + b"\n")

    async def embeddings(self, request: web.Request) -> web.Response:
        body, early = await self.admit(request)
        if early is not None:
            return early
        inputs = body.get("input")
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not inputs:
            return self.error(400, "input must be a string or a non-empty list", "input")
        vectors = [embedding(str(x), self.cfg.embedding_dim) for x in inputs]
        if body.get("encoding_format") == "base64":  # little-endian float32, as vLLM and OpenAI send it
            encoded: list[Any] = [base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode() for v in vectors]
        else:
            encoded = vectors
        data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(encoded)]
        tokens = count_words(inputs)
        return web.json_response({"object": "list", "data": data, "model": self.cfg.model,
                                  "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    async def generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        body, early = await self.admit(request)
        if early is not None:
            return early
        try:
            plan = dataclasses.replace(plan_generation(body, chat, self.cfg.tokens), model=self.answer_model(body))
        except BadRequest as exc:
            return self.error(400, str(exc), exc.param)
        wanted = plan.prompt_tokens + (plan.max_tokens if plan.max_tokens is not None else plan.completion_tokens)
        if wanted > self.cfg.max_model_len:
            message = (f"This model's maximum context length is {self.cfg.max_model_len} tokens. However, you "
                       f"requested {wanted} tokens.")
            if self.style.name == "tabby":
                return json_response(self.style.context_error(message))  # type: ignore[attr-defined]
            return self.error(400, message, "messages" if chat else "prompt")
        self.metrics.inc("waiting")
        if self.slots is not None:
            await self.slots.acquire()
        self.metrics.dec("waiting")
        self.processing += 1
        self.metrics.inc("running")
        start = time.perf_counter() + plan.prompt_tokens * self.cfg.prefill_per_token  # the ttft clock starts after prefill
        try:
            if plan.stream:
                return await self.stream(request, plan, chat, start)
            return await self.whole(request, plan, chat, start)
        finally:
            self.processing -= 1
            self.metrics.dec("running")
            if self.slots is not None:
                self.slots.release()

    def record(self, plan: Plan, start: float, first: float | None, end: float, produced: int) -> None:
        m = self.metrics
        m.inc("requests")
        m.inc("prompt_tokens", plan.prompt_tokens)
        m.inc("generation_tokens", produced)
        if self.cfg.speculative_tokens and produced > 1:
            # each verification step drafts k tokens and accepts one of them, as a fixed, checkable share
            steps = produced // 2
            m.inc("draft_tokens", steps * self.cfg.speculative_tokens)
            m.inc("accepted_tokens", steps)
        m.observe("e2e", end - start)
        if first is not None:
            m.observe("ttft", first - start)
            m.inc("prompt_seconds", first - start)
            m.inc("generation_seconds", end - first)
            if produced > 1:
                m.observe("itl", (end - first) / (produced - 1))

    async def until(self, start: float, index: int) -> None:
        """Sleep until token `index` is due: ttft after start, then one itl per token."""
        delay = start + self.cfg.ttft + index * self.cfg.itl - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)

    async def hang(self, request: web.Request) -> None:
        while request.transport is not None and not request.transport.is_closing():
            await asyncio.sleep(0.2)

    def ids(self, chat: bool) -> tuple[str, str]:
        prefix = "chatcmpl-" if chat else "cmpl-"
        return prefix + uuid.uuid4().hex[:24], "chat.completion.chunk" if chat else "text_completion"

    async def whole(self, request: web.Request, plan: Plan, chat: bool, start: float) -> web.StreamResponse:
        n = plan.completion_tokens
        cfg = self.cfg
        for limit in (cfg.crash_after, cfg.stall_after, cfg.malformed_after, cfg.error_after):
            if limit is not None and limit < n:
                await self.until(start, limit)
                break
        else:
            await self.until(start, max(n - 1, 0))
        if cfg.crash_after is not None and cfg.crash_after < n:
            os._exit(1)
        if cfg.stall_after is not None and cfg.stall_after < n:
            await self.hang(request)
            return web.Response(status=499)
        if cfg.malformed_after is not None and cfg.malformed_after < n:
            return web.Response(body=b'{"id": "broken", "choices": [{"message": {"content": "tok', content_type="application/json")
        if cfg.error_after is not None and cfg.error_after < n:
            self.generation_failed = True
            return self.error(500, "injected generation error")
        text = "".join(token_text(plan.offset + i) for i in range(n))
        rid, _ = self.ids(chat)
        choice: Json
        if chat and plan.tool is not None:
            call = {"id": plan.tool.call_id, "type": "function",
                    "function": {"name": plan.tool.name, "arguments": plan.tool.arguments}}
            choice = {"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                      "logprobs": None, "finish_reason": plan.finish_reason}
        elif chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": plan.finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": plan.finish_reason}
        end = time.perf_counter()
        payload: Json = {"id": rid, "object": "chat.completion" if chat else "text_completion",
                         "created": int(time.time()), "model": plan.model,
                         "choices": [{**choice, "index": i} for i in range(plan.n)]}
        if plan.service_tier is not None:
            payload["service_tier"] = plan.service_tier
        if not self.cfg.no_usage:
            payload["usage"] = usage(plan.prompt_tokens, n * plan.n)
        payload.update(self.style.extra_final_fields(plan.prompt_tokens, n, self.cfg.ttft, end - start - self.cfg.ttft))
        self.record(plan, start, start + self.cfg.ttft, end, n)
        return web.Response(body=orjson.dumps(payload), content_type="application/json")

    async def stream(self, request: web.Request, plan: Plan, chat: bool, start: float) -> web.StreamResponse:
        style, cfg = self.style, self.cfg
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                               "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        await response.prepare(request)
        rid, obj = self.ids(chat)
        created = int(time.time())
        sent = 0

        async def emit(payload: Json | bytes) -> None:
            nonlocal sent
            data = payload if isinstance(payload, bytes) else orjson.dumps(payload)
            await response.write(style.frame(data, sent))
            sent += 1

        def chunk(delta: Json | None, text: str | None, finish: str | None) -> Json:
            if chat:
                choice: Json = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            out: Json = {"id": rid, "object": obj, "created": created, "model": plan.model,
                         "choices": [{**choice, "index": i} for i in range(plan.n)]}
            if plan.service_tier is not None:
                out["service_tier"] = plan.service_tier
            return out

        for comment in style.comments_before_first_token(plan.prompt_tokens):
            await response.write(comment)
        n = produced = plan.completion_tokens
        first: float | None = None
        if plan.tool is not None:  # the call opens once (id, type, name), then arguments fragments
            await self.until(start, 0)
            first = time.perf_counter()
            await emit(chunk({"role": "assistant", "content": ""}, None, None))
            opened = {"index": 0, "id": plan.tool.call_id, "type": "function",
                      "function": {"name": plan.tool.name, "arguments": ""}}
            await emit(chunk({"tool_calls": [opened]}, None, None))
            for fragment in plan.tool.fragments():
                await emit(chunk({"tool_calls": [{"index": 0, "function": {"arguments": fragment}}]}, None, None))
            n, produced = 0, len(plan.tool.fragments()) + 1
        for i in range(n):
            if i == cfg.crash_after:
                os._exit(1)
            if i == cfg.stall_after:
                await self.hang(request)
                return response
            if i == cfg.error_after:
                self.generation_failed = True
                await emit(style.midstream_error("injected generation error"))
                if style.done_after_midstream_error:
                    await response.write(b"data: [DONE]" + style.separator)
                await response.write_eof()
                self.record(plan, start, first, time.perf_counter(), i)
                return response
            if i == cfg.malformed_after:
                await response.write(b'data: {"id": "broken", "choices": [{"delta": {"content": "tok' + style.separator)
            await self.until(start, i)
            text = token_text(plan.offset + i)
            if i == 0:
                first = time.perf_counter()
                if chat and style.role_chunk_separate():
                    await emit(chunk(style.first_delta(""), None, None))
                    await emit(chunk(style.delta(text), None, None))
                else:
                    await emit(chunk(style.first_delta(text) if chat else None, text, None))
            else:
                await emit(chunk(style.delta(text) if chat else None, text, None))
        end = time.perf_counter()
        final = chunk(style.final_delta() if chat else None, "", plan.finish_reason)
        gen_s = end - first if first is not None else 0.0
        final.update(style.extra_final_fields(plan.prompt_tokens, produced, (first or end) - start, gen_s))
        await emit(final)
        if plan.include_usage and not cfg.no_usage:
            await emit({"id": rid, "object": style.usage_object() if chat else obj, "created": created,
                        "model": plan.model, "choices": [], "usage": usage(plan.prompt_tokens, produced * plan.n)})
        await response.write(b"data: [DONE]" + style.separator)
        await response.write_eof()
        self.record(plan, start, first, end, produced)
        if cfg.close_after_stream and request.transport is not None:
            request.transport.close()
        return response


def parse_args(argv: list[str] | None = None) -> Config:
    p = argparse.ArgumentParser(prog="engine_emulator", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--style", required=True, choices=sorted(STYLES))
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=None, help="default: the engine's own default port")
    p.add_argument("--model", default="emulated-model", help="served model id")
    p.add_argument("--tokens", type=int, default=16, help="completion tokens when max_tokens allows")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--api-key", default=None)
    p.add_argument("--startup-delay", type=float, default=0.0, help="seconds in the loading phase")
    p.add_argument("--ttft-ms", type=float, default=0.0)
    p.add_argument("--itl-ms", type=float, default=0.0)
    p.add_argument("--crash-after-tokens", type=int, default=None)
    p.add_argument("--stall-after-tokens", type=int, default=None)
    p.add_argument("--malformed-after-tokens", type=int, default=None)
    p.add_argument("--error-after-tokens", type=int, default=None, help="send a mid-stream error event")
    p.add_argument("--error-rate", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fail-status", type=int, default=None, help="answer every generation request with CODE")
    p.add_argument("--parallel", type=int, default=0, help="requests generated at once (0: unlimited)")
    p.add_argument("--metrics", action="store_true", help="llamacpp: enable /metrics (other styles always)")
    p.add_argument("--embedding-dim", type=int, default=8)
    p.add_argument("--no-usage", action="store_true", help="never send usage (as some proxies and old servers)")
    p.add_argument("--models-503-while-loading", action="store_true",
                   help="llamacpp: /v1/models answers 503 while loading too (seen on llama-server b1-0c1e570)")
    p.add_argument("--worker-registration", default=None,
                   help="dynamo: a file 'model\\npid' a worker writes; no live worker: 503 and no model listed")
    p.add_argument("--worker-warmup", type=float, default=0.0,
                   help="dynamo: seconds after a worker registered during which requests still get 503")
    p.add_argument("--spawn-child", action="store_true",
                   help="start a worker process that ignores SIGTERM and outlives this one (as vLLM's EngineCore)")
    p.add_argument("--record-requests", metavar="FILE", default=None,
                   help="append each generation request (path, headers, body) to FILE as a JSON line")
    p.add_argument("--speculative-config", default=None,
                   help="vllm: its JSON speculative config; the emulator reports spec_decode counters for it")
    p.add_argument("--prefill-ms-per-token", type=float, default=0.0,
                   help="prefill time per prompt token (word), added to --ttft-ms")
    p.add_argument("--lora-modules", nargs="*", default=None, metavar="NAME=PATH",
                   help="vllm: --enable-lora with these adapters registered (none given: runtime loading only)")
    p.add_argument("--lora-load-ms", type=float, default=0.0, help="vllm: how long a runtime adapter load takes")
    p.add_argument("--close-after-stream", action="store_true",
                   help="close the connection after each stream without saying so (as llama-server was seen to)")
    a = p.parse_args(argv)
    speculative = json.loads(a.speculative_config) if a.speculative_config else {}
    if not 0.0 <= a.error_rate <= 1.0:
        p.error("--error-rate must be within [0, 1]")
    for flag in ("tokens", "max_model_len", "parallel", "embedding_dim"):
        if getattr(a, flag) < 0:
            p.error(f"--{flag.replace('_', '-')} must be >= 0")
    if a.ttft_ms < 0 or a.itl_ms < 0 or a.startup_delay < 0 or a.prefill_ms_per_token < 0:
        p.error("delays must be >= 0")
    if a.fail_status is not None and not 400 <= a.fail_status <= 599:
        p.error("--fail-status must be an HTTP error status (400-599)")
    port = a.port if a.port is not None else STYLES[a.style].default_port
    return Config(a.style, a.host, port, a.model, a.tokens, a.max_model_len, a.api_key, a.startup_delay,
                  a.ttft_ms / 1000.0, a.itl_ms / 1000.0, a.crash_after_tokens, a.stall_after_tokens,
                  a.malformed_after_tokens, a.error_after_tokens, a.error_rate, a.seed, a.fail_status,
                  a.parallel, a.metrics, a.embedding_dim, a.no_usage,
                  a.close_after_stream, a.models_503_while_loading, a.spawn_child,
                  a.worker_registration, a.worker_warmup, a.record_requests,
                  int(speculative.get("num_speculative_tokens") or 0), a.prefill_ms_per_token / 1000.0,
                  tuple(a.lora_modules) if a.lora_modules is not None else None, a.lora_load_ms / 1000.0)


def announce(message: str) -> None:
    print(message, flush=True)


# A worker in the engine's process group that ignores SIGTERM and lives on after the engine dies.
CHILD = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: time.sleep(1)\n"


async def serve(cfg: Config) -> None:
    emulator = Emulator(cfg)
    if cfg.spawn_child:
        child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.DEVNULL)
        announce(f"emulator child pid {child.pid}")
    # handler_cancellation: like real engines, a request whose client left stops generating
    runner = web.AppRunner(emulator.app(), access_log=None, handle_signals=False, handler_cancellation=True)
    await runner.setup()
    if emulator.style.loading == "closed":
        await asyncio.sleep(cfg.startup_delay)
        emulator.ready.set()
    site = web.TCPSite(runner, cfg.host, cfg.port, reuse_address=True)
    await site.start()
    port = int(runner.addresses[0][1])  # the bound port, also when --port 0
    url = f"http://{cfg.host}:{port}"
    if not emulator.ready.is_set() and cfg.startup_delay > 0:
        announce(f"emulator listening on {url} style={cfg.style} (loading for {cfg.startup_delay}s)")
        await asyncio.sleep(cfg.startup_delay)
    emulator.ready.set()
    emulator.metrics.set("model_ready", 1)
    announce(f"emulator ready on {url} style={cfg.style}")
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    try:
        import uvloop  # noqa: PLC0415 - optional speed-up

        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(serve(cfg))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
