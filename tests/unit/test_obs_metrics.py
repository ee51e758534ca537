"""Metrics, overhead header, /metrics key, info metric, engine-stat mapping and /v1/gateway/stats,
on a real app (the real middleware stack and routes) around a scripted in-memory adapter."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from adapters.base import Adapter, Capabilities, Completion, EngineStats, Health, RequestContext, StreamEvent, Usage
from gateway.app import create_app
from gateway.config import Settings
from gateway.planning import ModelSpec, Plan
from gateway.metrics import ERROR_TYPES, GatewayMetrics, plan_labels, route_label
from gateway.runtime import runtime_for_adapters
from gateway.timing import RequestTiming, TimedStream

ENGINE_DELAY_S = 0.2


class ScriptedAdapter(Adapter):
    """Answers after ENGINE_DELAY_S (non-stream) or streams three tokens; reports engine stats."""

    engine = "scripted"
    capabilities = Capabilities(chat=True, completions=False)

    def __init__(self) -> None:
        self.closed = False

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def health(self) -> Health:
        return Health(ready=True)

    async def engine_stats(self) -> EngineStats:
        return EngineStats(requests_running=1, requests_waiting=2, kv_cache_usage_ratio=0.25,
                           prompt_tokens_total=7, generation_tokens_total=9, ttft_seconds_sum=1.5, ttft_seconds_count=3)

    async def chat(self, body: dict[str, Any], ctx: RequestContext) -> Completion | AsyncIterator[StreamEvent]:
        if body.get("stream"):
            return self._stream()
        await asyncio.sleep(ENGINE_DELAY_S)
        usage = Usage(prompt_tokens=5, completion_tokens=3)
        return Completion(body={"id": "x", "object": "chat.completion", "choices": [], "usage": usage.as_dict()}, usage=usage)

    async def _stream(self) -> AsyncIterator[StreamEvent]:
        try:
            for word in ("a", "b", "c"):
                await asyncio.sleep(ENGINE_DELAY_S / 3)
                yield StreamEvent(data=orjson.dumps({"choices": [{"delta": {"content": word}}]}), has_content=True)
            yield StreamEvent(data=b"", usage=Usage(prompt_tokens=4, completion_tokens=3))
        finally:
            self.closed = True


async def make_client(**settings: Any) -> tuple[httpx.AsyncClient, Any, ScriptedAdapter]:
    config = Settings(**settings)
    adapter = ScriptedAdapter()
    rt = runtime_for_adapters(config, {"m1": adapter})
    rt.started = True
    app = create_app(config, rt)
    app.state.runtime = rt
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")
    return client, app, adapter


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    found = [v for (n, ls), v in samples(text).items() if n == name and all(dict(ls).get(k) == x for k, x in labels.items())]
    assert found, f"no sample {name} {labels}"
    return sum(found)


CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}


async def test_overhead_header_on_every_response_and_excludes_engine_time() -> None:
    client, app, _ = await make_client()
    async with client:
        for method, path, body in (("GET", "/health", None), ("GET", "/v1/models", None), ("GET", "/nope", None),
                                   ("POST", "/v1/chat/completions", CHAT)):
            r = await client.request(method, path, json=body)
            assert float(r.headers["x-enginegate-overhead-ms"]) >= 0, path
        started = time.perf_counter()
        chat = await client.post("/v1/chat/completions", json=CHAT)
        elapsed = time.perf_counter() - started
        assert chat.status_code == 200
        # The engine took at least ENGINE_DELAY_S of the request; the header reports only the rest.
        assert 0 < float(chat.headers["x-enginegate-overhead-ms"]) <= (elapsed - ENGINE_DELAY_S) * 1000
        text = (await client.get("/metrics")).text
    route = "/v1/chat/completions"
    total = value(text, "enginegate_request_duration_seconds_sum", route=route)
    overhead = value(text, "enginegate_overhead_seconds_sum", route=route)
    assert total >= 2 * ENGINE_DELAY_S
    assert 0 < overhead < total - 2 * ENGINE_DELAY_S + 1e-3
    assert value(text, "enginegate_e2e_request_latency_seconds_count", model="m1", engine="scripted") == 2
    assert value(text, "enginegate_request_prompt_tokens_sum", model="m1") == 10
    assert value(text, "enginegate_request_completion_tokens_count", model="m1") == 2


async def test_stream_metrics_itl_e2e_and_tokens() -> None:
    client, _, _ = await make_client()
    async with client:
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        assert r.text.endswith("data: [DONE]\n\n")
        text = (await client.get("/metrics")).text
    labels = {"model": "m1", "engine": "scripted"}
    assert value(text, "enginegate_time_to_first_token_seconds_count", **labels) == 1
    assert value(text, "enginegate_inter_token_latency_seconds_count", **labels) == 2  # 3 tokens, 2 gaps
    assert value(text, "enginegate_e2e_request_latency_seconds_count", **labels) == 1
    assert value(text, "enginegate_completion_tokens_total", **labels) == 3
    # Time spent waiting for the engine's events (at least ENGINE_DELAY_S in all) is upstream, not overhead.
    route = "/v1/chat/completions"
    total = value(text, "enginegate_request_duration_seconds_sum", route=route)
    assert 0 < value(text, "enginegate_overhead_seconds_sum", route=route) <= total - ENGINE_DELAY_S


async def test_metrics_key_protects_metrics_only() -> None:
    client, _, _ = await make_client(metrics_api_key="s3cret")
    async with client:
        assert (await client.get("/metrics")).status_code == 401
        assert (await client.get("/metrics", headers={"Authorization": "Bearer wrong"})).status_code == 401
        ok = await client.get("/metrics", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and "enginegate_requests_total" in ok.text
        assert (await client.get("/health")).status_code == 200


async def test_engine_stats_info_and_zeroed_error_series() -> None:
    client, app, _ = await make_client()
    backend = next(iter(app.state.runtime.models))
    backend.plan = Plan(engine="scripted", rule="cpu-only", reasons=("no GPU: llama.cpp ... [rule: cpu-only]", "second"),
                        spec=ModelSpec(path="m.gguf", format="gguf", quantization="Q4_1"))
    async with client:
        text = (await client.get("/metrics")).text
    labels = {"model": "m1", "engine": "scripted"}
    assert value(text, "enginegate_engine_requests_waiting", **labels) == 2
    assert value(text, "enginegate_engine_kv_cache_usage_ratio", **labels) == 0.25
    assert value(text, "enginegate_engine_time_to_first_token_seconds_sum", **labels) == 1.5
    assert value(text, "enginegate_engine_time_to_first_token_seconds_count", **labels) == 3
    assert value(text, "enginegate_model_info", rule="cpu-only", quantization="Q4_1", **labels) == 1
    assert value(text, "enginegate_generation_slots", model="m1") == 1
    assert value(text, "enginegate_queue_capacity", model="m1") == 16
    for kind in ERROR_TYPES:
        assert value(text, "enginegate_errors_total", model="m1", type=kind) == 0


def test_plan_labels_name_the_rule_and_the_real_quantisation() -> None:
    assert plan_labels(None) == ("unknown", "unknown")
    spec = ModelSpec(path="m", format="awq", quantization="awq 4-bit g128")
    assert plan_labels(Plan(engine="vllm", rule="nvidia-gpu", reasons=("x",), spec=spec)) == ("nvidia-gpu", "awq 4-bit g128")
    user_set = Plan(engine="vllm", rule="production", spec=spec, options={"quantization": "fp8"})
    assert plan_labels(user_set) == ("production", "fp8")
    rule, quant = plan_labels(Plan(engine="vllm", rule="r" * 500))
    assert len(rule) == 120 and quant == "unknown"


async def test_stats_summary_changes_after_traffic() -> None:
    client, _, _ = await make_client()
    async with client:
        before = (await client.get("/v1/gateway/stats")).json()
        await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        after = (await client.get("/v1/gateway/stats")).json()
    m0, m1 = before["models"]["m1"], after["models"]["m1"]
    assert m0["requests"] == 0 and m1["requests"] == 1
    assert m1["completion_tokens"] == 3 and m1["ttft_seconds"]["count"] == 1
    assert m1["ready"] is True and m1["engine"] == "scripted"
    assert after["overhead_seconds"]["count"] == 1


async def test_console_is_public_and_its_api_is_not() -> None:
    client, _, _ = await make_client(api_keys=("k",))
    async with client:
        page = await client.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert (await client.get("/console/app.js")).status_code == 200  # the page loads without a key
        assert (await client.get("/v1/gateway/stats")).status_code == 401  # /v1 routes keep their key


def test_route_labels_are_bounded() -> None:
    assert route_label("/console/pages/status.js") == "/console"
    assert route_label("/v1/models/abc") == "/v1/models/{id}"
    assert route_label("/anything/else") == "other"


async def test_timed_stream_counts_upstream_and_forwards_close() -> None:
    closed = asyncio.Event()

    async def inner() -> AsyncIterator[int]:
        try:
            await asyncio.sleep(0.05)
            yield 1
            yield 2
        finally:
            closed.set()

    timing = RequestTiming()
    stream = TimedStream(inner(), timing)
    assert await stream.__anext__() == 1
    await stream.aclose()
    assert closed.is_set() and timing.upstream >= 0.05
    assert timing.overhead(timing.upstream + 0.01) == pytest.approx(0.01)


def test_metrics_registry_is_per_app() -> None:
    a, b = GatewayMetrics(gpu=False), GatewayMetrics(gpu=False)
    a.errors.labels("m", "engine").inc()
    assert b"enginegate_errors_total{" not in b.render()


def test_request_ids_are_distinct_hex_across_refills_and_fresh_in_a_forked_child() -> None:
    import os

    from gateway.metrics import new_request_id

    ids = [new_request_id() for _ in range(1000)]  # several draws of the pool
    assert len(set(ids)) == 1000 and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first id must not be the parent's next one
        os.write(write, new_request_id().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    os.close(write)
    assert child != new_request_id() and len(child) == 32
