"""LoRA adapters loaded at run time with a gateway-side LRU (`lora_loading: runtime`), through a real gateway
process and the official `openai` client, on the vLLM adapter whose program is the vLLM emulator
(tests/engines/fake_engine.py checks vLLM's flag grammar; tests/emulators/vllm_lora.py serves
/v1/load_lora_adapter and /v1/unload_lora_adapter as vLLM's source does, only with
VLLM_ALLOW_RUNTIME_LORA_UPDATING set). Two places (`max_loras: 2`), three adapters and one whose directory
holds no adapter."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest

from tests.gateway_process import RunningGateway, gateway

pytestmark = pytest.mark.integration
REPO_ROOT = Path(__file__).resolve().parents[2]
BASE = "base-model"
ASK = [{"role": "user", "content": "one two"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    tmp = tmp_path_factory.mktemp("lora-runtime")
    (tmp / "model").mkdir()
    adapters = []
    for name in ("a", "b", "c", "broken"):
        (tmp / name).mkdir()
        if name != "broken":
            (tmp / name / "adapter_config.json").write_text(json.dumps({"r": 8, "target_modules": ["q_proj"]}))
        adapters.append({"name": f"tone-{name}", "path": str(tmp / name)})
    options = {"executable": [sys.executable, "-m", "tests.engines.fake_engine", "vllm"],
               "env": {"PYTHONPATH": str(REPO_ROOT), "FAKE_ENGINE_ARGS": "--tokens 32 --itl-ms 150 --lora-load-ms 300"},
               "log_dir": str(tmp / "logs"), "restart_backoff": 0.1, "lora_loading": "runtime", "max_loras": 2}
    config = {"models": [{"source": str(tmp / "model"), "name": BASE, "engine": "vllm", "options": options,
                          "adapters": adapters}]}
    with gateway(config_yaml=json.dumps(config)) as gw:
        yield gw


def client(gw: RunningGateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=60)


def ask(gw: RunningGateway, model: str, tokens: int = 2) -> str:
    reply = client(gw).chat.completions.create(model=model, messages=ASK, max_tokens=tokens)  # type: ignore[arg-type]
    assert reply.model == model
    return reply.choices[0].message.content or ""


def engine(gw: RunningGateway) -> dict[str, Any]:
    """The emulator's own record: registered adapters, every load and unload, the most registered at once."""
    (proc,) = [p for p in psutil.Process(gw.process.pid).children(recursive=True)
               if "tests.emulators.engine_emulator" in " ".join(p.cmdline())]
    argv = proc.cmdline()
    port, key = argv[argv.index("--port") + 1], argv[argv.index("--api-key") + 1] if "--api-key" in argv else ""
    answer = httpx.get(f"http://127.0.0.1:{port}/emulator/loras", headers={"Authorization": f"Bearer {key}"},
                       timeout=10).json()
    answer["pid"] = proc.pid
    return dict(answer)


def lora_info(gw: RunningGateway) -> str:
    return next(line for line in gw.metrics().splitlines() if line.startswith("vllm:lora_requests_info{"))


def test_none_loads_at_start_and_each_loads_on_first_use_within_two_places(served: RunningGateway) -> None:
    start = engine(served)
    assert start["registered"] == [] and start["calls"] == []  # nothing registered at start
    argv = " ".join(psutil.Process(start["pid"]).cmdline())
    listed = {m.id for m in client(served).models.list().data}
    assert {BASE, "tone-a", "tone-b", "tone-c"} <= listed  # every configured adapter is served
    assert ask(served, "tone-a") and ask(served, "tone-b") and ask(served, BASE)
    assert engine(served)["calls"] == ["load tone-a", "load tone-b"]
    ask(served, "tone-a")  # a is now the more recent: c takes b's place
    ask(served, "tone-c")
    after = engine(served)
    assert after["calls"] == ["load tone-a", "load tone-b", "unload tone-b", "load tone-c"]
    assert after["registered"] == ["tone-a", "tone-c"] and after["peak"] == 2, (after, argv)


def test_two_first_requests_for_one_adapter_load_it_once(served: RunningGateway) -> None:
    before = len(engine(served)["calls"])
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: ask(served, "tone-b"), range(4)))
    assert len(set(answers)) == 1
    calls = engine(served)["calls"][before:]
    assert calls.count("load tone-b") == 1 and len(calls) == 2, calls  # one load (no refused second), one eviction


def test_an_adapter_in_flight_is_not_evicted(served: RunningGateway) -> None:
    """tone-b holds a place while its slow stream runs; tone-a and tone-c then share the other place."""
    ask(served, "tone-b")
    ask(served, "tone-c")
    before = len(engine(served)["calls"])
    # b in flight from its first chunk for 4.6 s (32 tokens 150 ms apart): what follows takes well under that
    stream = client(served).chat.completions.create(model="tone-b", messages=ASK, max_tokens=32, stream=True)  # type: ignore[arg-type]
    first = next(iter(stream))
    try:
        ask(served, "tone-c")  # b the least recently used, but held
        ask(served, "tone-a")  # so c is evicted, not b
    finally:
        rest = list(stream)
    assert first.model == "tone-b" and all(c.model == "tone-b" for c in rest)
    assert engine(served)["calls"][before:] == ["unload tone-c", "load tone-a"]


def test_a_load_failure_answers_that_client_only(served: RunningGateway) -> None:
    for _ in range(4):  # past the breaker's threshold (3): one broken adapter is no engine failure
        with pytest.raises(openai.APIStatusError) as err:
            ask(served, "tone-broken")
        assert err.value.status_code == 503 and err.value.code == "adapter_load_failed"
    assert "tone-broken" in err.value.message and "broken" not in err.value.message.replace("tone-broken", "")
    assert "No adapter found" in served.log()  # the operator's reason is in the gateway's log
    assert ask(served, BASE) and ask(served, "tone-a")  # not an outage for others
    replicas = httpx.get(served.url + "/v1/gateway/stats", timeout=10).json()["models"][BASE]["replicas"]
    assert [(r["state"], r["failed"]) for r in replicas] == [("closed", 0)], replicas
    assert len(engine(served)["registered"]) <= 2


def test_the_picker_metric_lists_what_is_loaded_now(served: RunningGateway) -> None:
    ask(served, "tone-a")
    loaded = set(engine(served)["registered"])
    deadline = time.monotonic() + 30  # the gauge follows the gateway's poll
    while True:
        info = lora_info(served)
        running = set(info.split('running_lora_adapters="')[1].split('"')[0].split(","))
        if loaded <= running or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    waiting = set(info.split('waiting_lora_adapters="')[1].split('"')[0].split(","))
    assert loaded <= running and {"tone-a", "tone-b", "tone-c", "tone-broken"} - loaded <= waiting, info


def test_a_restarted_engine_loads_its_adapters_again(served: RunningGateway) -> None:
    ask(served, "tone-a")
    old = engine(served)["pid"]
    psutil.Process(old).kill()
    deadline = time.monotonic() + 60
    while True:  # the supervisor restarts the engine; the gateway's record of its adapters starts empty
        try:
            if ask(served, "tone-a"):
                break
        except openai.APIStatusError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    fresh = engine(served)
    assert fresh["pid"] != old and fresh["calls"] == ["load tone-a"], fresh



@pytest.fixture(scope="module")
def two_replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    tmp = tmp_path_factory.mktemp("lora-runtime-replicas")
    (tmp / "model").mkdir()
    for name in ("a", "b"):
        (tmp / name).mkdir()
        (tmp / name / "adapter_config.json").write_text(json.dumps({"r": 8}))
    options = {"executable": [sys.executable, "-m", "tests.engines.fake_engine", "vllm"],
               "env": {"PYTHONPATH": str(REPO_ROOT), "FAKE_ENGINE_ARGS": "--tokens 4 --itl-ms 300"},
               "log_dir": str(tmp / "logs"), "lora_loading": "runtime", "max_loras": 2, "max_concurrency": 1}
    config = {"models": [{"source": str(tmp / "model"), "name": BASE, "engine": "vllm", "options": options,
                          "replicas": 2, "routing": {"balance": "round_robin", "affinity": "none"},
                          "adapters": [{"name": f"tone-{n}", "path": str(tmp / n)} for n in "ab"]}]}
    with gateway(config_yaml=json.dumps(config)) as gw:
        yield gw


def engines(gw: RunningGateway) -> list[dict[str, Any]]:
    """Each replica's emulator record."""
    out = []
    for proc in psutil.Process(gw.process.pid).children(recursive=True):
        argv = proc.cmdline()
        if "tests.emulators.engine_emulator" not in " ".join(argv):
            continue
        port, key = argv[argv.index("--port") + 1], argv[argv.index("--api-key") + 1] if "--api-key" in argv else ""
        out.append(httpx.get(f"http://127.0.0.1:{port}/emulator/loras", headers={"Authorization": f"Bearer {key}"},
                             timeout=10).json())
    return out


def decisions(gw: RunningGateway, model: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for line in gw.metrics().splitlines():
        if line.startswith("enginegate_routing_decisions_total{") and f'model="{model}"' in line:
            reason = line.split('reason="')[1].split('"')[0]
            found[reason] = found.get(reason, 0.0) + float(line.rsplit(" ", 1)[1])
    return found


def test_an_adapter_goes_where_the_loader_loaded_it_unless_that_replica_is_much_busier(
        two_replicas: RunningGateway) -> None:
    # round robin would send every other request to the replica without the adapter: the rule keeps them where
    # the loader loaded it (both idle: no round of waiting to save)
    for _ in range(4):
        ask(two_replicas, "tone-a")
    records = engines(two_replicas)
    assert len(records) == 2 and sorted(r["calls"] for r in records) == [[], ["load tone-a"]], records
    assert decisions(two_replicas, "tone-a").get("adapter_loaded", 0) >= 1
    # four at once, one slot each: the loaded replica keeps those round robin gives it and takes the other's
    # while it is at most a round of its slots busier; the last would wait three rounds there, so it stays on
    # the other replica, which loads the adapter
    with ThreadPoolExecutor(4) as pool:
        futures = []
        for _ in range(4):  # each 0.9 s long (4 tokens, 300 ms apart), sent 0.1 s apart
            futures.append(pool.submit(ask, two_replicas, "tone-a", 4))
            time.sleep(0.1)
        assert all(f.result() for f in futures)
    records = engines(two_replicas)
    assert sorted(r["calls"] for r in records) == [["load tone-a"], ["load tone-a"]], (records, decisions(two_replicas, "tone-a"))
    assert decisions(two_replicas, "tone-a").get("adapter_load", 0) >= 1
