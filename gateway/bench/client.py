"""One timed request against an OpenAI-compatible endpoint (aiohttp: ~4x the load of httpx per core).

Time to first token runs from just before the request is sent to the arrival of the first
event that carries generated content (role-only deltas, pings and keep-alive comments do not
count). Token counts come from `usage`; only when the endpoint sends none does the bench count
with a tokenizer, or else count content events, and it records which it did.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

import aiohttp
import orjson

from gateway.bench.workload import BenchRequest, Endpoint

TokenSource = Literal["usage", "tokenizer", "chunks"]
Counter = Callable[[str], int]


@dataclass(frozen=True)
class Target:
    name: str
    base_url: str
    model: str
    api_key: str | None = None
    endpoint: Endpoint = "chat"
    stream: bool = True
    hold_length: bool = True
    timeout_s: float = 300.0
    read_timeout_s: float | None = None  # None: only the total; a queued request may say nothing for long
    alternates: tuple[str, ...] = ()
    """More base URLs of the same service (other gateways in front of the same engines): a session's turns
    go to `base_url` and these in turn, session i's turn t to the ((i + t - 1) mod n)-th."""

    def for_turn(self, session: int, turn: int) -> Target:
        if not self.alternates:
            return self
        urls = (self.base_url, *self.alternates)
        return dataclasses.replace(self, base_url=urls[(session + turn - 1) % len(urls)], alternates=())

    @property
    def url(self) -> str:
        base = self.base_url.rstrip("/")
        if not urlsplit(base).path.endswith("/v1"):
            base += "/v1"
        return base + ("/chat/completions" if self.endpoint == "chat" else "/completions")

    def headers(self, request: BenchRequest | None = None) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        if request is not None:
            headers.update(request.headers)
        return headers

    def body(self, request: BenchRequest) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, **request.body, "max_tokens": request.max_tokens,
                                "temperature": 0.0}
        if self.hold_length:
            body["ignore_eos"] = True
            body["min_tokens"] = request.max_tokens
        if self.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body


@dataclass
class RequestResult:
    start: float
    end: float = 0.0
    error: str | None = None  # a kind: http_503, timeout, stream_error, malformed_event, ...
    detail: str | None = None
    ttft: float | None = None
    content_times: list[float] = field(default_factory=list)  # seconds after start, one per content event
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    token_source: TokenSource = "usage"
    max_tokens: int = 0
    streamed: bool = True
    retried: bool = False  # sent twice: the first try met a connection the server had closed
    turn: int | None = None  # a multi-turn session's turn (1-based); None outside sessions
    cached_tokens: int | None = None  # prompt tokens the endpoint served from its cache (usage.prompt_tokens_details)
    text: str | None = None  # the generated text, kept only when the request asked (`keep_text`)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def e2e(self) -> float:
        return self.end - self.start

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (e2e - ttft) / (tokens - 1)."""
        if self.ttft is None or not self.completion_tokens or self.completion_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.completion_tokens - 1)

    @property
    def itls(self) -> list[float]:
        """Gaps between successive content events (an event may carry more than one token)."""
        t = self.content_times
        return [b - a for a, b in zip(t, t[1:])]


def _content_of(obj: dict[str, Any]) -> tuple[str, bool]:
    """(generated text in this chunk, whether it carried content of any kind, tool calls included)."""
    text = ""
    has = False
    for choice in obj.get("choices") or ():
        delta = choice.get("delta")
        if isinstance(delta, dict):
            piece = delta.get("content") or ""
            reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
            if piece or reasoning or delta.get("tool_calls"):
                has = True
            text += piece + reasoning
        else:
            piece = choice.get("text") or (choice.get("message") or {}).get("content") or ""
            if piece:
                has = True
            text += piece
    return text, has


def _is_error(obj: Any) -> bool:
    return isinstance(obj, dict) and ("error" in obj or obj.get("object") == "error")


def _apply_usage(result: RequestResult, usage: Any) -> None:
    if isinstance(usage, dict):
        result.prompt_tokens = usage.get("prompt_tokens")
        result.completion_tokens = usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        result.cached_tokens = cached if isinstance(cached, int) and not isinstance(cached, bool) else None


def _fallback_counts(result: RequestResult, request: BenchRequest, output: str, events: int,
                     counter: Counter | None) -> None:
    if result.completion_tokens is not None:
        return
    if counter is not None:
        result.token_source = "tokenizer"
        result.completion_tokens = counter(output)
        result.prompt_tokens = counter(request.prompt_text)
    else:
        result.token_source = "chunks"
        result.completion_tokens = events


async def _read_stream(response: aiohttp.ClientResponse, result: RequestResult, request: BenchRequest,
                       counter: Counter | None) -> None:
    buffer = b""
    done = finished = False
    output: list[str] = []
    events = 0
    async for data in response.content.iter_any():
        now = time.perf_counter() - result.start
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        for raw in lines:
            line = raw.rstrip(b"\r")
            if not line.startswith(b"data:"):
                continue  # blank separators, `: ping` and keep-alive comments, event: lines
            payload = line[5:].strip()
            if payload == b"[DONE]":
                done = True
                continue
            try:
                obj = orjson.loads(payload)
            except orjson.JSONDecodeError:
                result.error, result.detail = "malformed_event", payload[:200].decode(errors="replace")
                return
            if _is_error(obj):
                result.error, result.detail = "stream_error", payload[:200].decode(errors="replace")
                return
            text, has_content = _content_of(obj)
            if has_content:
                events += 1
                output.append(text)
                result.content_times.append(now)
                if result.ttft is None:
                    result.ttft = now
            for choice in obj.get("choices") or ():
                if choice.get("finish_reason"):
                    finished = True
            if obj.get("usage"):
                _apply_usage(result, obj["usage"])
    if not (done or finished):
        result.error, result.detail = "incomplete_stream", "the stream ended without a finish_reason or [DONE]"
        return
    if request.keep_text:
        result.text = "".join(output)
    _fallback_counts(result, request, "".join(output), events, counter)


async def _read_whole(response: aiohttp.ClientResponse, result: RequestResult, request: BenchRequest,
                      counter: Counter | None) -> None:
    raw = await response.read()
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        result.error, result.detail = "malformed_response", raw[:200].decode(errors="replace")
        return
    if _is_error(obj):
        result.error, result.detail = "error_body", raw[:200].decode(errors="replace")
        return
    result.ttft = time.perf_counter() - result.start  # no stream: the first token arrives with the last
    result.content_times.append(result.ttft)
    _apply_usage(result, obj.get("usage"))
    text, _ = _content_of(obj)
    if request.keep_text:
        result.text = text
    _fallback_counts(result, request, text, 1, counter)


async def send(session: aiohttp.ClientSession, target: Target, request: BenchRequest,
               counter: Counter | None = None) -> RequestResult:
    """Never raises for a failed request: every outcome becomes a RequestResult.

    A request that fails before any response arrives, on a connection the server had already
    closed (llama-server closes after a stream without saying so), is sent once more on a new
    connection with a fresh clock, as HTTP clients do; `retried` records it.
    """
    body = orjson.dumps(target.body(request))
    timeout = aiohttp.ClientTimeout(total=target.timeout_s, sock_read=target.read_timeout_s)
    for attempt in (0, 1):
        result = RequestResult(start=time.perf_counter(), max_tokens=request.max_tokens, streamed=target.stream,
                               retried=attempt > 0, turn=request.turn)
        responded = False
        try:
            async with session.post(target.url, data=body, headers=target.headers(request), timeout=timeout) as response:
                responded = True
                if response.status >= 400:
                    text = await response.text(errors="replace")
                    result.error, result.detail = f"http_{response.status}", text[:200]
                elif target.stream:
                    await _read_stream(response, result, request, counter)
                else:
                    await _read_whole(response, result, request, counter)
        except asyncio.TimeoutError:
            result.error = "timeout"
            limit = f", or {target.read_timeout_s}s without a byte" if target.read_timeout_s else ""
            result.detail = f"no complete answer within {target.timeout_s}s{limit}"
        except aiohttp.ClientConnectorError as exc:
            result.error, result.detail = "connect_error", str(exc)[:200]
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError) as exc:
            if not responded and attempt == 0:
                continue
            result.error, result.detail = "disconnected", str(exc)[:200] or type(exc).__name__
        except aiohttp.ClientError as exc:
            result.error, result.detail = "client_error", f"{type(exc).__name__}: {exc}"[:200]
        break
    result.end = time.perf_counter()
    return result


def make_session(connections: int) -> aiohttp.ClientSession:
    """A connection pool (`connections` 0: unlimited). Idle connections are dropped after 2 s, before
    servers drop theirs (llama-server and uvicorn after 5 s): a POST sent on a connection the server
    just closed fails without a retry, and would be counted as the endpoint's error."""
    connector = aiohttp.TCPConnector(limit=connections, limit_per_host=0, ttl_dns_cache=300, keepalive_timeout=2.0)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))
