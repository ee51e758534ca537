"""The relay's fast path (issue 38.3): hot routes past the router, one upstream read sent as one
write, cached metric children, the one client watch per request."""

from __future__ import annotations

import asyncio

import orjson
import prometheus_client
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from adapters.base import StreamEvent
from adapters.openai_http import Relay
from gateway.api import chat, completions, embeddings, messages, responses
from gateway.api.disconnect import ClientWatch
from gateway.api.errors import APIError
from gateway.api.hot_routes import exception_handler
from gateway.api.resume import Held
from gateway.api.serving import EventStream, LastChunk, _sse
from gateway.app import create_app
from gateway.config import Settings
from gateway.drain import Drain
from gateway.metrics import GatewayMetrics, Histogram, TracedHistogram
from gateway.routing import Admission, Backend
from gateway.runtime import runtime_for_adapters
from tests.fakes import EchoAdapter


def test_every_hot_route_is_the_endpoint_fastapi_routes_to() -> None:
    app = create_app(Settings(), runtime_for_adapters(Settings(), {"echo": EchoAdapter()}))
    layer = app.build_middleware_stack()
    while type(layer).__name__ != "HotRoutes":
        layer = layer.app  # type: ignore[attr-defined]
    routed = {r.path: r.endpoint for r in app.router.routes if "POST" in getattr(r, "methods", ())}
    routed |= {r.path: r.endpoint for m in (chat, completions, embeddings, responses, messages) for r in m.router.routes}
    assert layer.routes and all(routed[path] is endpoint for path, endpoint in layer.routes.items())


def test_hot_routes_answer_errors_in_the_apis_shape_and_other_methods_405() -> None:
    with TestClient(create_app(Settings(), runtime_for_adapters(Settings(), {"echo": EchoAdapter()}))) as c:
        r = c.post("/v1/chat/completions", content=b"{not json")
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        r = c.post("/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        assert c.get("/v1/chat/completions").status_code == 405


@pytest.mark.parametrize(("exc", "expected"), [
    (APIError(400, "x"), APIError), (KeyError("k"), LookupError), (ValueError("v"), None),
])
def test_exception_handler_by_mro_never_the_catch_all(exc: Exception, expected: type | None) -> None:
    handlers = {APIError: APIError, LookupError: LookupError, Exception: Exception}
    assert exception_handler(handlers, exc) is expected  # type: ignore[arg-type]


def test_cached_children_are_dropped_with_remove() -> None:
    h = Histogram("h_seconds", "h", ["model"], registry=(r := CollectorRegistry()))
    h.labels("a").observe(1)
    h.remove("a")
    h.labels("a").observe(2)
    assert r.get_sample_value("h_seconds_sum", {"model": "a"}) == 2


@pytest.mark.parametrize("amounts", [
    [0.0, 0.001, 0.005, 0.005, 0.0051, 0.3, 7.5, 1e9, 0.02, 0.001],  # on and between bounds, past the last
    [0.004],
])
def test_our_observe_and_observe_all_record_what_prometheus_clients_observe_records(amounts: list[float]) -> None:
    registry = CollectorRegistry()
    bounds = (0.001, 0.005, 0.02, 0.3, 7.5)
    reference = prometheus_client.Histogram("reference_seconds", "h", ["model"], buckets=bounds, registry=registry)
    one = TracedHistogram("one_seconds", "h", ["model"], buckets=bounds, registry=registry)
    many = TracedHistogram("many_seconds", "h", ["model"], buckets=bounds, registry=registry)
    for amount in amounts:
        reference.labels("m").observe(amount)
        one.labels("m").observe(amount)
    many.labels("m").observe_all(amounts)
    samples = {f.name: [(s.name.split("_seconds")[1], s.labels, s.value) for s in f.samples if not s.name.endswith("_created")]
               for f in registry.collect()}
    assert samples["one_seconds"] == samples["reference_seconds"] == samples["many_seconds"]
    with pytest.raises(ValueError):
        one.observe(1.0)  # the family, not a child: prometheus_client's own refusal


def test_nan_is_counted_in_no_bucket_by_observe_and_observe_all_as_by_prometheus_client() -> None:
    import math

    registry = CollectorRegistry()
    made = [cls(f"h{i}_seconds", "h", ["model"], buckets=(0.1, 1.0), registry=registry)
            for i, cls in enumerate((prometheus_client.Histogram, TracedHistogram, TracedHistogram))]
    made[0].labels("m").observe(0.5)
    made[0].labels("m").observe(float("nan"))
    made[1].labels("m").observe(0.5)
    made[1].labels("m").observe(float("nan"))
    made[2].labels("m").observe_all([0.5, float("nan")])
    buckets = [[(s.labels["le"], s.value) for s in f.samples if s.name.endswith("_bucket")] for f in registry.collect()]
    sums = [next(s.value for s in f.samples if s.name.endswith("_sum")) for f in registry.collect()]
    assert buckets[0] == buckets[1] == buckets[2] and buckets[0][-1] == ("+Inf", 1.0)
    assert all(math.isnan(total) for total in sums)


async def test_a_relayed_read_with_several_events_marks_all_but_its_last() -> None:
    body = b"".join(b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": {"content": w}}]}) + b"\n\n"
                    for w in ("a", "b", "c")) + b"data: [DONE]\n\n"

    class Once:
        status = 200
        chunks = [body, b""]

        async def read_chunk(self, deadline: float | None = None) -> bytes:
            return self.chunks.pop(0)

        def release(self) -> None: ...

        def abort(self) -> None: ...

    events = [e async for e in Relay()._events(Once(), False)]  # type: ignore[arg-type]
    assert [e.more for e in events] == [True, True, False]


async def test_events_of_one_read_leave_in_one_write_and_others_alone() -> None:
    async def upstream():  # type: ignore[no-untyped-def]
        yield StreamEvent(b'{"a":1}', has_content=True, more=True)
        yield StreamEvent(b"", more=True)  # observe-only usage
        yield StreamEvent(b'{"b":2}', has_content=True)
        yield StreamEvent(b'{"c":3}', has_content=True)

    adapter = EchoAdapter()
    backend = Backend(model_id="echo", adapter=adapter, admission=Admission(1, 0))
    lease = await backend.acquire()
    out = [chunk async for chunk in _sse(upstream(), backend, Held(lease), GatewayMetrics(), 0.0, drain=Drain(grace=1.0))]
    assert out == [b'data: {"a":1}\n\ndata: {"b":2}\n\n', b'data: {"c":3}\n\n', b"data: [DONE]\n\n"]


async def test_client_watch_cancels_its_task_on_disconnect_and_not_after_stop() -> None:
    left: asyncio.Queue[dict[str, str]] = asyncio.Queue()

    async def watched(stop_first: bool) -> str:
        watch = ClientWatch(left.get)
        if stop_first:
            watch.stop()
        try:
            await asyncio.sleep(0.5 if stop_first else 30)
        except asyncio.CancelledError:
            assert watch.caused()
            return "gone"
        return "finished"

    task = asyncio.ensure_future(watched(False))
    await asyncio.sleep(0)
    await left.put({"type": "http.disconnect"})
    assert await task == "gone" and task.cancelling() == 0
    task = asyncio.ensure_future(watched(True))
    await asyncio.sleep(0)
    await left.put({"type": "http.disconnect"})
    assert await task == "finished"


async def test_a_stopped_watch_ends_by_itself_once_uvicorn_completes_the_response() -> None:
    """ClientWatch.stop() does not cancel its watcher: under the real server every request's watcher
    must still end (no task left behind per request), streamed or not."""
    import httpx
    import uvicorn

    from adapters.process import free_port

    port = free_port()
    app = create_app(Settings(), runtime_for_adapters(Settings(), {"echo": EchoAdapter()}))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    serving = asyncio.ensure_future(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.02)
        body = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:  # one kept-alive connection
            for stream in (False, True) * 5:
                r = await client.post("/v1/chat/completions", json={**body, "stream": stream})
                assert r.status_code == 200
            for _ in range(50):
                watchers = [t for t in asyncio.all_tasks() if "ClientWatch._watch" in repr(t.get_coro())]
                if not watchers:
                    break
                await asyncio.sleep(0.02)
            assert not watchers
    finally:
        server.should_exit = True
        await serving


@pytest.mark.parametrize(("level", "access_log"), [("info", True), ("debug", True), ("warning", False), ("error", False)])
def test_uvicorn_formats_access_lines_only_where_its_level_writes_them(level: str, access_log: bool) -> None:
    from gateway.server import build_server

    settings = Settings(log_level=level)  # type: ignore[arg-type]
    server = build_server(create_app(settings, runtime_for_adapters(settings, {"echo": EchoAdapter()})), settings)
    assert server.config.access_log is access_log


@pytest.mark.parametrize(("chunks", "bodies"), [
    ([b"a", LastChunk(b"z")], [(b"a", True), (b"z", False)]),  # the end rides on the last chunk
    ([b"a", b"b"], [(b"a", True), (b"b", True), (b"", False)]),  # no last chunk: an empty end
])
async def test_event_stream_sends_its_last_chunk_as_the_last_message(chunks: list[bytes],
                                                                      bodies: list[tuple[bytes, bool]]) -> None:
    after: list[bytes] = []

    async def gen():  # type: ignore[no-untyped-def]
        for c in chunks:
            yield c
        after.append(b"read past the last chunk")

    left: asyncio.Queue[dict[str, str]] = asyncio.Queue()
    sent: list[dict[str, object]] = []

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    await EventStream(gen(), ClientWatch(left.get))({"type": "http"}, left.get, send)  # type: ignore[arg-type]
    assert sent[0]["type"] == "http.response.start"
    assert [(m["body"], m["more_body"]) for m in sent[1:]] == bodies
    assert not after or type(chunks[-1]) is not LastChunk  # nothing asked of the stream after its last chunk
