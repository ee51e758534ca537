"""The endpoint picker's metrics (vllm:* names, per model): the arithmetic as a table, then the
exposition on a real app's /metrics around scripted adapters (one that reports its own stats, one
that reports none, so the gateway's admission fills in)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

from adapters.base import Adapter, Capabilities, Completion, EngineStats, Health, RequestContext, StreamEvent, Usage
from gateway.app import create_app
from gateway.config import Settings
from gateway.epp_metrics import KV_USAGE, KV_USAGE_OLD, LORA_INFO, RUNNING, WAITING, ReplicaLoad, model_load
from gateway.routing import Admission
from gateway.runtime import runtime_for_adapters
from tests.unit.test_obs_metrics import samples

S = EngineStats


@pytest.mark.parametrize("replicas, waiting, running, kv, source", [
    # the engine reports everything: its running, its waiting plus the gateway's queue, its KV use
    ([ReplicaLoad(3, 4, 4, S(requests_running=2, requests_waiting=2, kv_cache_usage_ratio=0.5))], 5, 2, 0.5, "engine"),
    # the engine reports nothing: the gateway's admitted count, and slots in use as the KV stand-in
    ([ReplicaLoad(1, 2, 4, None)], 1, 2, 0.5, "slots"),
    ([ReplicaLoad(0, 3, 4, S())], 0, 3, 0.75, "slots"),
    # no gateway cap (an external URL) and no engine figure: no KV reading to give
    ([ReplicaLoad(0, 7, None, None)], 0, 7, 0.0, "slots"),
    # two replicas: counts add up, KV use is the mean; one reports KV, the other falls back
    ([ReplicaLoad(1, 2, 2, S(requests_running=2, kv_cache_usage_ratio=0.9)), ReplicaLoad(2, 1, 2, None)],
     3, 3, (0.9 + 0.5) / 2, "mixed"),
    # out-of-range or non-finite engine KV is clamped or ignored
    ([ReplicaLoad(0, 0, 1, S(kv_cache_usage_ratio=1.7))], 0, 0, 1.0, "engine"),
    ([ReplicaLoad(0, 1, 1, S(kv_cache_usage_ratio=float("nan")))], 0, 1, 1.0, "slots"),
    ([], 0, 0, 0.0, "slots"),
])
def test_model_load(replicas: list[ReplicaLoad], waiting: float, running: float, kv: float, source: str) -> None:
    load = model_load(replicas)
    assert (load.waiting, load.running, load.kv_source) == (waiting, running, source)
    assert load.kv_usage == pytest.approx(kv)


class GatedAdapter(Adapter):
    """Streams one token per release of its gate; reports `stats` (None: reports nothing)."""

    engine = "scripted"
    capabilities = Capabilities(chat=True, completions=False)

    def __init__(self, stats: EngineStats | None, ready: bool = True) -> None:
        self.stats = stats
        self.ready = ready
        self.gate = asyncio.Event()

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def health(self) -> Health:
        return Health(ready=self.ready)

    async def engine_stats(self) -> EngineStats | None:
        return self.stats

    async def chat(self, body: dict[str, Any], ctx: RequestContext) -> Completion | AsyncIterator[StreamEvent]:
        return self._stream()

    async def _stream(self) -> AsyncIterator[StreamEvent]:
        await self.gate.wait()
        yield StreamEvent(data=orjson.dumps({"choices": [{"delta": {"content": "x"}}]}), has_content=True)
        yield StreamEvent(data=b"", usage=Usage(prompt_tokens=1, completion_tokens=1))


def app_for(adapters: dict[str, Adapter], **settings: Any) -> tuple[httpx.AsyncClient, Any]:
    config = Settings(**settings)
    rt = runtime_for_adapters(config, adapters)
    rt.started = True
    app = create_app(config, rt)
    app.state.runtime = rt
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"), rt


async def test_engine_figures_and_admission_fill_in_per_model() -> None:
    reporting = GatedAdapter(S(requests_running=5, requests_waiting=1, kv_cache_usage_ratio=0.4))
    silent = GatedAdapter(None)
    client, rt = app_for({"big": reporting, "small": silent})
    backend = next(b for b in rt.models if b.model_id == "small")
    backend.replicas[0].admission = backend.admission = Admission(2, 4)  # two slots
    async with client:
        body = {"model": "small", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        held = asyncio.create_task(client.post("/v1/chat/completions", json=body))
        deadline = time.monotonic() + 10
        while backend.admission.running < 1:  # the request holds one of the two slots
            assert time.monotonic() < deadline and not held.done()
            await asyncio.sleep(0.01)
        text = (await client.get("/metrics")).text
        silent.gate.set()
        assert (await held).status_code == 200
    got = samples(text)
    assert got[(WAITING, (("model_name", "big"),))] == 1  # the engine's queue (the gateway's is empty)
    assert got[(RUNNING, (("model_name", "big"),))] == 5
    assert got[(KV_USAGE, (("model_name", "big"),))] == 0.4
    assert got[(KV_USAGE_OLD, (("model_name", "big"),))] == 0.4
    assert got[(WAITING, (("model_name", "small"),))] == 0
    assert got[(RUNNING, (("model_name", "small"),))] == 1  # the gateway's count: the engine says nothing
    assert got[(KV_USAGE, (("model_name", "small"),))] == 0.5  # one of two slots
    (lora,) = [(labels, v) for (name, labels), v in got.items() if name == LORA_INFO]
    labels = dict(lora[0])
    assert labels == {"max_lora": "2", "running_lora_adapters": "big,small", "waiting_lora_adapters": ""}
    assert abs(lora[1] - time.time()) < 60  # the reading's time, as vLLM sets it


async def test_a_model_not_ready_is_listed_as_waiting() -> None:
    client, _ = app_for({"up": GatedAdapter(None), "loading": GatedAdapter(None, ready=False)})
    async with client:
        text = (await client.get("/metrics")).text
    (labels,) = [dict(labels) for (name, labels) in samples(text) if name == LORA_INFO]
    assert labels["running_lora_adapters"] == "up" and labels["waiting_lora_adapters"] == "loading"


async def test_the_setting_turns_them_off() -> None:
    client, _ = app_for({"m": GatedAdapter(None)}, epp_metrics=False)
    async with client:
        text = (await client.get("/metrics")).text
    assert "vllm:" not in text and "enginegate_generations_running" in text


def test_the_exposition_has_vllm_types_and_help() -> None:
    from gateway.metrics import GatewayMetrics
    from gateway.epp_metrics import ModelLoad, ServedNames

    m = GatewayMetrics(gpu=False)
    assert b"vllm:" not in m.render()  # nothing before the first reading
    m.epp.update({"a": ModelLoad(1, 2, 0.25, "engine")}, ServedNames(("a",), ()))
    text = m.render().decode()
    for name in (WAITING, RUNNING, KV_USAGE, KV_USAGE_OLD, LORA_INFO):
        assert f"# TYPE {name} gauge" in text
    assert 'vllm:num_requests_running{model_name="a"} 2.0' in text
