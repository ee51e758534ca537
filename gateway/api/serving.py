"""The request flow shared by every generation route: parse, route, admit, call the adapter, measure."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from typing import Any, Protocol, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from adapters.base import (
    Adapter,
    ChatResult,
    ClientRequestError,
    Completion,
    EngineError,
    Operation,
    RequestContext,
    StreamEvent,
    UnsupportedError,
)
from adapters.upstream_errors import stream_failure
from gateway.api.disconnect import ClientGone, ClientWatch
from gateway.api.errors import CLIENT_CLOSED, APIError, echoed, error_payload, error_response
from gateway.api.validate import check_output_limits
from gateway.drain import SHUTTING_DOWN, Drain
from gateway.metrics import GatewayMetrics, request_id, set_model_label
from gateway.identity import caller_of
from gateway.api import resume
from gateway.api.fanout import Call
from gateway.api.resume import Held
from gateway.api.scheduling import observe_wait, refused, request_demand, with_engine_priority, within_ceiling
from gateway.routing import Backend, DeadlineExceeded, Lease, ModelUnavailable, QueueFull, Refusal, Replica, RouteKey
from gateway.routing.health import is_retryable
from gateway.cache_routing.blocks import chain, prompt_text
from gateway.preemption import resumable
from gateway.request_view import RequestView, view_of
from gateway.routing.route_key import route_key
from gateway.scheduling import Demand
from gateway.runtime import Runtime
from gateway.tenancy import middleware as tenancy
from gateway.tenancy.limits import reservation
from gateway.tenancy.service import KeyRevoked, Refused
from gateway.tenancy.store import StoreUnavailable
from gateway.tenancy.ticket import Ticket
from gateway.timing import TimedStream, request_timing
from gateway.recent import RequestFacts, finish_of, request_facts
from gateway.tracing import spans
from gateway.tracing import switch as tracing
from gateway.tracing.attributes import chunk_model

log = logging.getLogger("enginegate.api")

M = TypeVar("M", bound=BaseModel)
OPERATIONS: dict[Operation, Callable[[Adapter, dict[str, Any], RequestContext], Awaitable[ChatResult]]] = {
    "chat": lambda adapter, body, ctx: adapter.chat(body, ctx),
    "completions": lambda adapter, body, ctx: adapter.completions(body, ctx),
    "embeddings": lambda adapter, body, ctx: adapter.embeddings(body, ctx),
    "responses": lambda adapter, body, ctx: adapter.responses(body, ctx),
}
"""The adapter's typed operation for each route."""

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
SSE_RAW_HEADERS = StreamingResponse(iter(()), media_type="text/event-stream", headers=SSE_HEADERS).raw_headers
"""What Starlette's StreamingResponse sent for a stream (content-type with its charset)."""
DONE = b"data: [DONE]\n\n"
ITL_BATCH = 32
"""A stream's inter-token gaps reach the ITL histogram this many at a time (and the rest at its end):
at 20 tokens/s a live stream's gaps show within 1.6 s, at a fraction of one observation per token."""
SHUTDOWN_MESSAGE = "the gateway is shutting down: the drain grace period ended before this request finished"


class StreamWriter(Protocol):
    """Turns one generation's chat stream events into the bytes one API sends (one writer per request)."""

    def event(self, event: StreamEvent) -> bytes: ...

    def error(self, status: int, message: str) -> bytes: ...

    async def end(self) -> bytes: ...


class Dialect(Protocol):
    """How an API speaks a chat result: chat itself, or a translation (Responses, Anthropic Messages)."""

    async def complete(self, result: Completion) -> Response: ...

    def writer(self) -> StreamWriter: ...


class _ChatWriter:
    def event(self, event: StreamEvent) -> bytes:
        return b"data: " + event.data + b"\n\n" if event.data else b""

    def error(self, status: int, message: str) -> bytes:
        return b"data: " + orjson.dumps(error_payload(status, message)) + b"\n\n"

    async def end(self) -> bytes:
        return DONE


class ChatDialect:
    """The OpenAI chat/completions wire form: the engine's own bytes, passed through."""

    async def complete(self, result: Completion) -> Response:
        content = result.body if isinstance(result.body, bytes) else orjson.dumps(result.body)
        return Response(content, status_code=result.status, media_type="application/json")

    def writer(self) -> StreamWriter:
        return CHAT_WRITER


CHAT = ChatDialect()
CHAT_WRITER = _ChatWriter()  # stateless: one serves every chat stream


MAX_NESTING = 254


async def parse_body(request: Request, model: type[M],
                     before: Callable[[dict[str, Any]], None] | None = None) -> tuple[M, dict[str, Any]]:
    """The body, parsed as `model`; `before(body)` first checks the raw object (refusals.refuse)."""
    raw = await request.body()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise APIError(400, f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    try:  # what is relayed is written by orjson, which nests at most MAX_NESTING levels (its reader, 1024)
        orjson.dumps(body)
    except TypeError as exc:
        raise APIError(400, f"request body nests deeper than {MAX_NESTING} levels") from exc
    if before is not None:
        before(body)
    try:
        parsed = model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = _param(first["loc"])
        raise APIError(400, f"{param}: {first['msg']}" if param else first["msg"], param=param) from exc
    return parsed, body


def _param(loc: tuple[int | str, ...]) -> str | None:
    """The field path of a validation error, without pydantic's union-member tags (`str`, `list[str]`)."""
    path: list[str] = []
    for part in loc:
        if isinstance(part, str) and (part in _TYPE_TAGS or "[" in part or "-" in part):
            break
        path.append(str(part))
    return ".".join(path) or None


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list", "bytes", "none"})


def runtime(request: Request) -> Runtime:
    return request.app.state.runtime  # type: ignore[no-any-return]


def metrics(request: Request) -> GatewayMetrics:
    return request.app.state.metrics  # type: ignore[no-any-return]


MAX_LISTED_MODELS = 20


def model_not_found(request: Request, name: str) -> APIError:
    """404 naming (at most 64 characters of) the unknown model and the models served here."""
    shown = echoed(name)
    served = [b.model_id for b in runtime(request).models.served()
              if tenancy.may_use(request.scope, b.model_id, b.aliases)]
    listed = ", ".join(served[:MAX_LISTED_MODELS]) + (", ..." if len(served) > MAX_LISTED_MODELS else "")
    return APIError(404, f"The model `{shown}` does not exist; served here: {listed or 'none'}",
                    param="model", code="model_not_found")


def resolve_backend(request: Request, model: str, operation: Operation) -> Backend:
    backend = runtime(request).models.get(model)
    if backend is None or not tenancy.may_use(request.scope, backend.model_id, backend.aliases):
        raise model_not_found(request, model)  # a model outside the key's list does not exist for it
    set_model_label(request.scope, backend.model_id)
    if backend.parent is not None and backend.model_id not in {a.name for a in getattr(backend.adapter, "loras", ())}:
        raise APIError(400, f"model `{backend.model_id}` is a LoRA adapter of `{backend.parent}`, whose engine "
                            f"({backend.engine}) cannot select an adapter per request (docs/lora.md)",
                       param="model", code="unsupported_parameter")
    if not backend.adapter.capabilities.supports(operation):
        raise APIError(
            400,
            f"model `{backend.model_id}` (engine {backend.engine}) does not support {operation}",
            param="model",
            code="unsupported_operation",
        )
    return backend


def require(backend: Backend, body: dict[str, Any]) -> None:
    """What every generation route asks of the engine's capabilities (chat's tools and formats: chat.check_chat)."""
    if (body.get("logprobs") or body.get("top_logprobs")) and not backend.adapter.capabilities.logprobs:
        raise APIError(400, f"logprobs are not supported by the {backend.engine} engine (llamacpp, llama-server, vllm and "
                       "sglang give them)", param="logprobs", code="unsupported_parameter")


async def reserve_limits(request: Request, backend: Backend, view: RequestView, facts: dict[str, Any]) -> Ticket:
    """The key's limits, before admission, reserving the prompt's estimate and max_tokens x n (the model's context
    when unset): 429 with Retry-After over a limit, 503 when the key store is down."""
    context = facts.get("context_length")
    charge = reservation(view, context if isinstance(context, int) else None)
    try:
        if tracing.ON and spans.recording():
            caller = caller_of(request.scope)
            with spans.limits(caller.name if caller is not None else None):
                return await tenancy.reserve(request.scope, request.app.state.tenancy, backend.model_id, charge)
        return await tenancy.reserve(request.scope, request.app.state.tenancy, backend.model_id, charge)
    except Refused as exc:
        message, headers = tenancy.refusal(exc.decision, runtime(request).settings.retry_after_seconds, charge.tokens)
        if exc.decision.refused == "budget":
            raise APIError(429, message, code="insufficient_quota", headers=headers) from exc
        raise APIError(429, message, code="rate_limit_exceeded", headers=headers) from exc
    except KeyRevoked as exc:  # revoked or rotated since its lookup was cached: as the lookup would answer
        raise APIError(401, "Incorrect, revoked or expired API key.", code="invalid_api_key",
                       headers={"WWW-Authenticate": "Bearer"}) from exc
    except StoreUnavailable as exc:
        raise APIError(503, "The key store is unreachable; try again shortly.", code="store_unavailable",
                       headers={"Retry-After": str(runtime(request).settings.retry_after_seconds)}) from exc


async def admit(request: Request, backend: Backend, route: RouteKey | None = None,
                exclude: Collection[Replica] = (), demand: Demand | None = None) -> Lease:
    """Wait for the model to be loaded and a free engine slot on one of its replicas.

    A full queue answers 429 (to the client the scheduler refuses), a deadline that passes while
    queued 504; a model that cannot be loaded now (memory held by pinned or busy
    models, its engines failed, the load timed out) answers 503 with Retry-After and the reason."""
    m = metrics(request)
    started = time.perf_counter()
    try:
        if tracing.ON and spans.recording():
            lease = await _traced_acquire(backend, route, exclude, demand)
        else:
            lease = await backend.acquire(route, exclude=exclude, demand=demand)
    except (Refusal, DeadlineExceeded) as exc:
        raise refused(m, backend, exc, runtime(request).settings.retry_after_seconds) from exc
    except ModelUnavailable as exc:
        m.rejected.labels(backend.model_id).inc()
        raise APIError(503, exc.reason, code=exc.code, headers={"Retry-After": str(exc.retry_after)}) from exc
    except QueueFull as exc:
        m.rejected.labels(backend.model_id).inc()
        retry_after = str(runtime(request).settings.retry_after_seconds)
        raise APIError(429, f"model `{backend.model_id}` is busy: {exc}", code="queue_full", headers={"Retry-After": retry_after}) from exc
    waited = time.perf_counter() - started
    m.queue_wait.labels(backend.model_id).observe(waited)
    observe_wait(m, backend, demand, waited)
    m.routing_decisions.labels(backend.model_id, lease.replica.name, lease.reason or "least_outstanding").inc()
    request_timing(request.scope).queued += waited
    facts = request_facts(request.scope)
    if facts is not None:
        facts.engine, facts.replica, facts.admitted = lease.adapter.engine, lease.replica.name, time.perf_counter()
    return lease


async def _traced_acquire(backend: Backend, route: RouteKey | None, exclude: Collection[Replica],
                          demand: Demand | None) -> Lease:
    with spans.queue(backend, demand) as span:
        started = time.perf_counter()
        lease = await backend.acquire(route, exclude=exclude, demand=demand)
        spans.waited(span, time.perf_counter() - started)
    spans.route(backend, lease)
    return lease


def request_route(request: Request, backend: Backend, view: RequestView, body: dict[str, Any]) -> RouteKey | None:
    """The request's session and prefix keys, when its model routes by affinity over several replicas;
    its prompt's blocks when it routes by cache."""
    routing = backend.routing
    if routing.affinity == "cache":
        if not backend.routes_by_cache:
            return None
        text = prompt_text(view)
        if text is None:
            return None
        return RouteKey(blocks=chain(text, routing.block_chars), text=text, body=body, path=request.url.path)
    if routing.affinity == "none" or len(backend.replicas) < 2:
        return None
    return route_key(view, request.headers, routing.session_header, routing.prefix_chars)


def with_slot(body: dict[str, Any], lease: Lease) -> dict[str, Any]:
    """The engine slot the router chose, in the engine's own field; a slot the client named is kept, and
    several choices (`n`) are left to the engine (one slot would run them one after another)."""
    field = getattr(getattr(lease.adapter, "spec", None), "slot_field", None)
    if lease.slot is None or field is None or field in body or (isinstance(body.get("n"), int) and body["n"] > 1):
        return body
    return {**body, field: lease.slot}


async def generate(
    request: Request,
    backend: Backend,
    operation: Operation,
    body: dict[str, Any],
    include_usage: bool,
    dialect: Dialect = CHAT,
    call: Callable[[Adapter], Call] | None = None,
) -> Response:
    """`call(adapter)` replaces the adapter's operation (fan-out for n > 1); admission and metrics stay the same."""
    facts = backend.adapter.describe()
    check_output_limits(body, facts)
    view = view_of(body, generates=operation != "embeddings")  # the one view of this prompt everything below reads
    arrived = time.perf_counter()
    ctx = RequestContext(request_id=request_id(request.scope), model=backend.model_id, include_usage=include_usage)
    m = metrics(request)
    drain = request.app.state.drain
    run = call or (lambda adapter: lambda b, c: OPERATIONS[operation](adapter, b, c))
    demand = request_demand(request, body, view)  # a header it cannot read is the client's 400, before any limit is spent
    body = within_ceiling(body, demand, caller_of(request.scope))
    if call is None and backend.preempts and resumable(operation, body):
        demand = dataclasses.replace(demand, preemptible=True)
    ticket = await reserve_limits(request, backend, view, facts)
    route = request_route(request, backend, view, body)
    watch = ClientWatch(request.receive)  # the work runs in this task; the client leaving cancels it
    streaming = False
    try:
        guarded = drain.register(watch.task)  # the drain may end it (not a context manager: ~1 % of a request)
        try:
            lease, result, attempt = await _admitted_call(request, backend, operation, run, body, ctx, route,
                                                          demand, arrived)
        except asyncio.CancelledError:
            if watch.caused():
                drain.ending()  # the drain may have cancelled it too: taken back as well
                raise ClientGone from None
            if not drain.ending():
                raise
            m.errors.labels(backend.model_id, "cancelled").inc()
            return error_response(503, SHUTDOWN_MESSAGE, code=SHUTTING_DOWN,
                                  headers={"Retry-After": str(drain.retry_after)})
        finally:
            drain.unregister(guarded)
        facts = request_facts(request.scope)
        if not isinstance(result, Completion):
            streaming = True  # the watch goes on with the stream, which stops it
            held = Held(lease, attempt)
            if demand.preemptible and lease.replica.admission.preempts:
                result = _resumable(request, backend, operation, run, body, ctx, route, demand, arrived, result, held)
            sse = _sse(TimedStream(result, request_timing(request.scope)), backend, held, m, arrived, dialect.writer(),
                       drain, ticket, facts)
            return EventStream(sse, watch)
    except ClientGone:
        gone = request_facts(request.scope)
        if gone is not None:
            gone.abandoned = True
        m.disconnects.labels(backend.model_id, backend.engine).inc()
        m.errors.labels(backend.model_id, "cancelled").inc()
        log.info("client disconnected before the response to %s; its work was cancelled", backend.model_id)
        return Response(status_code=CLIENT_CLOSED)
    finally:
        if not streaming:
            watch.stop()
    lease.report(result.usage)
    lease.release()
    if attempt is not None:
        attempt.completed(result)
    if facts is not None:
        facts.finish_reason = finish_of(result.body)
    if result.usage is not None:
        if facts is not None:
            u = result.usage
            facts.usage(u.prompt_tokens, u.completion_tokens, u.cached_tokens, u.prefill_seconds)
        _count_tokens(m, backend, result.usage.prompt_tokens, result.usage.completion_tokens)
        ticket.record(result.usage.prompt_tokens, result.usage.completion_tokens)
    if result.status < 400:
        m.e2e.labels(backend.model_id, backend.engine).observe(time.perf_counter() - arrived)
    return await dialect.complete(result)


class LastChunk(bytes):
    """A stream's final bytes (its end, or the error that ends it): `EventStream` closes the stream (its
    `finally` records usage and frees the slot) and sends them as the response's last message, which
    uvicorn writes with the chunked body's terminator in one system call instead of two (~1.5 % of a
    relayed stream's CPU). `_sse` yields nothing after one."""


class EventStream(Response):
    """The SSE response: each chunk one body message; the request's `ClientWatch` goes on watching, so
    a client that leaves cancels the stream where it waits (then `_sse` closes the adapter's stream
    and frees the slot), as Starlette's StreamingResponse does with a task group and a listener of
    its own for every stream."""

    media_type = "text/event-stream"

    def __init__(self, chunks: AsyncIterator[bytes], watch: ClientWatch) -> None:
        self._chunks = chunks
        self._watch = watch
        self.status_code = 200
        self.background = None
        self.raw_headers = list(SSE_RAW_HEADERS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for chunk in self._chunks:
                if type(chunk) is LastChunk:  # the response's last message: one write, not two
                    # the stream's bookkeeping first (usage into the key's ticket, the slot, the metrics), as
                    # when the stream ended before the last message: that message settles the ticket
                    await self._chunks.aclose()  # type: ignore[attr-defined]
                    self._watch.stop()  # before the last message, after which every receive says disconnect
                    await send({"type": "http.response.body", "body": chunk, "more_body": False})
                    return
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            self._watch.stop()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not self._watch.caused():
                raise
        finally:
            self._watch.stop()
            await self._chunks.aclose()  # type: ignore[attr-defined]


async def _admitted_call(
    request: Request,
    backend: Backend,
    name: Operation,
    operation: Callable[[Adapter], Call],
    body: dict[str, Any],
    ctx: RequestContext,
    route: RouteKey | None = None,
    demand: Demand | None = None,
    arrived: float = 0.0,
) -> tuple[Lease, ChatResult, spans.Attempt | None]:
    """Wait for a slot, then run the operation on the leased replica; the lease is the caller's to release on success.

    An engine that fails before it answered anything (refused, reset, down, 502/503) is retried on
    another replica, up to `routing.max_retries` times: nothing has reached the client yet."""
    tried: list[Replica] = []
    while True:
        lease = await admit(request, backend, route, exclude=tried, demand=demand)
        attempt = None
        if tracing.ON:
            if spans.recording():
                attempt = spans.attempt(name, backend, lease, body, len(tried), arrived)
                sent_headers = attempt.headers
            else:  # no span, but the engine still learns the trace and that it is not sampled
                sent_headers = spans.unsampled_headers()
            ctx.extra["headers"] = {**ctx.extra.get("headers", {}), **sent_headers}  # the relay sends traceparent
        timing = request_timing(request.scope)
        started = time.perf_counter()  # the adapter's call counts as upstream time
        try:
            sent = with_slot(with_engine_priority(body, lease, demand), lease)
            result = await operation(lease.adapter)(sent, ctx)
        except BaseException as exc:
            timing.upstream += time.perf_counter() - started
            if attempt is not None:
                attempt.failed(exc)
            lease.release(exc)
            tried.append(lease.replica)
            if (isinstance(exc, Exception) and is_retryable(exc) and len(tried) <= backend.routing.max_retries
                    and any(r not in tried for r in backend.replicas)):
                metrics(request).retries.labels(backend.model_id, lease.replica.name).inc()
                log.warning("%s replica %s failed before answering (%s); retrying on another replica",
                            backend.model_id, lease.replica.name, getattr(exc, "message", exc))
                continue
            if isinstance(exc, Exception):
                _count_error(metrics(request), backend, exc)
            raise
        timing.upstream += time.perf_counter() - started
        return lease, result, attempt


def _resumable(request: Request, backend: Backend, operation: Operation, run: Callable[[Adapter], Call],
               body: dict[str, Any], ctx: RequestContext, route: RouteKey | None, demand: Demand, arrived: float,
               events: AsyncIterator[StreamEvent], held: Held) -> AsyncIterator[StreamEvent]:
    """The stream, resumed on a fresh slot (first of its flow) when the scheduler preempts it. Resumed, it may
    take a kept slot again but is never cut again (admission): a neighbour's requests cost a flood at most one
    more prefill per stream."""
    async def again(resumed: dict[str, Any], added: int) -> tuple[Lease, ChatResult, spans.Attempt | None]:
        again_demand = dataclasses.replace(demand, resumed=True, deadline=None,
                                           prompt_tokens=demand.prompt_tokens + added)
        return await _admitted_call(request, backend, operation, run, resumed, ctx, route, again_demand, arrived)

    def preempted() -> None:
        metrics(request).preemptions.labels(backend.model_id).inc()
        log.info("a %s stream gave its slot to a newcomer; it resumes on the next free one", backend.model_id)

    return resume.resumable(events, held, operation, body, again, preempted)


async def _sse(
    events: AsyncIterator[StreamEvent],
    backend: Backend,
    segment: Held,
    m: GatewayMetrics,
    arrived: float,
    writer: StreamWriter = CHAT_WRITER,
    drain: Drain | None = None,
    ticket: Ticket | None = None,
    facts: RequestFacts | None = None,
) -> AsyncIterator[bytes]:
    first_at: float | None = None
    last_at = arrived
    usage = None
    ended = False
    content_events = 0
    held = b""  # bytes of events that came with more in one upstream read
    failure: BaseException | None = None
    finish_reason: str | None = None
    response_model: str | None = None
    gaps: list[float] = []  # inter-token gaps not yet in the ITL histogram (observed in batches)
    itl = m.itl.labels(backend.model_id, backend.engine)
    drain = drain or Drain(grace=0.0)
    guarded = drain.register()  # the drain may end this stream: an error event, then the end
    try:
        try:
            async for event in events:
                if event.has_content:
                    content_events += 1
                    now = time.perf_counter()
                    if first_at is None:
                        first_at = now
                        segment.lease.prefilled()
                        m.ttft.labels(backend.model_id, backend.engine).observe(first_at - arrived)
                        if segment.attempt is not None:
                            segment.attempt.first_token(first_at)
                            response_model = chunk_model(event.data) if event.data else None
                    else:
                        gaps.append(now - last_at)
                        if len(gaps) == ITL_BATCH:
                            itl.observe_all(gaps)
                            gaps = []
                    last_at = now
                if event.usage is not None:
                    usage = event.usage
                if event.finish_reason is not None:
                    finish_reason = event.finish_reason
                if event.is_error:
                    m.errors.labels(backend.model_id, "engine_stream").inc()
                    failure = stream_failure(event.data)
                out = writer.event(event)
                if event.more and not event.is_error:
                    held += out  # sent with the rest of its upstream read
                    continue
                if held:
                    out, held = held + out, b""
                if event.is_error:
                    ended = True
                    yield LastChunk(out)
                    return
                if out:
                    yield out
        except asyncio.CancelledError:
            if not drain.ending():
                raise
            m.errors.labels(backend.model_id, "cancelled").inc()
            ended = True
            yield LastChunk(held + writer.error(503, SHUTDOWN_MESSAGE))
            return
        except (EngineError, UnsupportedError, ClientRequestError) as exc:
            _count_error(m, backend, exc)
            failure = exc
            ended = True
            status = getattr(exc, "status", 400)
            yield LastChunk(held + writer.error(status, exc.message))
            return
        except Exception as exc:  # never a hung or half-open stream
            log.exception("stream failed")
            _count_error(m, backend, exc)
            failure = exc
            ended = True
            yield LastChunk(held + writer.error(500, f"stream failed: {type(exc).__name__}"))
            return
        ended = True
        m.e2e.labels(backend.model_id, backend.engine).observe(time.perf_counter() - arrived)
        yield LastChunk(held + await writer.end())
    finally:
        if gaps:
            itl.observe_all(gaps)
        drain.unregister(guarded)
        await events.aclose()  # type: ignore[attr-defined]
        segment.lease.report(usage)
        segment.lease.release(failure)
        if segment.attempt is not None:
            segment.attempt.stream_ended(usage, finish_reason, response_model, ended, failure)
        if not ended:
            m.disconnects.labels(backend.model_id, backend.engine).inc()
            log.info("client disconnected from a %s stream; generation cancelled", backend.model_id)
        if facts is not None:
            facts.stream, facts.first_token, facts.abandoned = True, first_at, not ended
            facts.last_token = last_at if first_at is not None else None
            facts.finish_reason = "error" if failure is not None and finish_reason in (None, "failed") else finish_reason
            if usage is not None:
                facts.usage(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens, usage.prefill_seconds)
        if ticket is not None:
            ticket.streamed_events = content_events
            ticket.failed = failure is not None
            if usage is not None:
                ticket.record(usage.prompt_tokens, usage.completion_tokens)
        if usage is not None:
            _count_tokens(m, backend, usage.prompt_tokens, usage.completion_tokens)
            if first_at is not None and usage.completion_tokens > 1:
                m.tpot.labels(backend.model_id, backend.engine).observe((last_at - first_at) / (usage.completion_tokens - 1))


def _count_tokens(m: GatewayMetrics, backend: Backend, prompt: int, completion: int) -> None:
    m.prompt_tokens.labels(backend.model_id, backend.engine).inc(prompt)
    m.completion_tokens.labels(backend.model_id, backend.engine).inc(completion)
    m.request_prompt_tokens.labels(backend.model_id, backend.engine).observe(prompt)
    if completion:
        m.request_completion_tokens.labels(backend.model_id, backend.engine).observe(completion)


def _count_error(m: GatewayMetrics, backend: Backend, exc: BaseException) -> None:
    kind = {
        UnsupportedError: "unsupported",
        ClientRequestError: "client",
        EngineError: "engine",
    }.get(type(exc), "cancelled" if not isinstance(exc, Exception) else "internal")
    m.errors.labels(backend.model_id, kind).inc()
