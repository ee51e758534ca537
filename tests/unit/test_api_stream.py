"""SSE framing and metrics through the real app with a fake adapter."""

from __future__ import annotations

import orjson
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.config import Settings
from gateway.runtime import runtime_for_adapters
from tests.fakes import EchoAdapter

CHAT = {"model": "echo", "messages": [{"role": "user", "content": "one two three"}], "stream": True}


def client_for(adapter: EchoAdapter) -> TestClient:
    s = Settings()
    return TestClient(create_app(s, runtime_for_adapters(s, {"echo": adapter})))


def sse_payloads(text: str) -> list[str]:
    assert text.endswith("\n\n")
    return [block.removeprefix("data: ") for block in text.split("\n\n") if block]


def test_stream_framing_role_first_done_last_and_usage_only_when_asked() -> None:
    with client_for(EchoAdapter()) as c:
        r = c.post("/v1/chat/completions", json=CHAT)
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["cache-control"] == "no-cache"
        assert r.headers["x-accel-buffering"] == "no"
        events = sse_payloads(r.text)
        assert events[-1] == "[DONE]"
        chunks = [orjson.loads(e) for e in events[:-1]]
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
        assert all("usage" not in ch for ch in chunks)  # observe-only usage event is never sent

        r = c.post("/v1/chat/completions", json={**CHAT, "stream_options": {"include_usage": True}})
        chunks = [orjson.loads(e) for e in sse_payloads(r.text)[:-1]]
        assert chunks[-1]["choices"] == []
        assert chunks[-1]["usage"]["completion_tokens"] == 3


def metric_value(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if not line.startswith(name + "{") and line.split(" ")[0] != name:
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_metrics_count_requests_tokens_and_ttft() -> None:
    with client_for(EchoAdapter()) as c:
        c.post("/v1/chat/completions", json={**CHAT, "stream": False})
        c.post("/v1/chat/completions", json=CHAT)
        c.post("/v1/chat/completions", json={**CHAT, "model": "missing"})
        text = c.get("/metrics").text
    assert metric_value(text, "enginegate_requests_total", route="/v1/chat/completions", model="echo", status="200") == 2
    assert metric_value(text, "enginegate_requests_total", route="/v1/chat/completions", model="unknown", status="404") == 1
    assert metric_value(text, "enginegate_completion_tokens_total", model="echo", engine="echo") == 6
    assert metric_value(text, "enginegate_prompt_tokens_total", model="echo", engine="echo") == 6
    assert metric_value(text, "enginegate_time_to_first_token_seconds_count", model="echo", engine="echo") == 1
    assert metric_value(text, "enginegate_time_per_output_token_seconds_count", model="echo", engine="echo") == 1
    assert metric_value(text, "enginegate_requests_in_flight", route="/v1/chat/completions") == 0


async def test_closing_the_sse_stream_early_closes_the_adapter_stream_and_counts_a_disconnect() -> None:
    from adapters.base import RequestContext
    from gateway.api.resume import Held
    from gateway.api.serving import _sse
    from gateway.drain import Drain
    from gateway.metrics import GatewayMetrics
    from gateway.routing import Admission, Backend

    adapter = EchoAdapter()
    backend = Backend(model_id="echo", adapter=adapter, admission=Admission(1, 0))
    lease = await backend.acquire()
    m = GatewayMetrics()
    events = await adapter.chat({**CHAT, "messages": [{"role": "user", "content": "a b c d e f"}]}, RequestContext("r", "echo"))
    sse = _sse(events, backend, Held(lease), m, 0.0, drain=Drain(grace=1.0))  # type: ignore[arg-type]
    assert (await sse.__anext__()).startswith(b"data: ")
    assert (await sse.__anext__()).startswith(b"data: ")
    await sse.aclose()  # what Starlette does when the client goes away
    assert adapter.closed_streams == 1 and adapter.completed_streams == 0
    assert backend.admission.running == 0  # the slot was given back
    text = m.render().decode()
    assert metric_value(text, "enginegate_client_disconnects_total", model="echo", engine="echo") == 1
