"""LoRA adapters as models of their own, on a real llama-server, through a real gateway process and the
official `openai` client. The adapters are made here (tests/lora_adapters.py: random rank-4 adapters over
the embedded model's attention weights, written with the `gguf` package)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from adapters.llama_server import find_llama_server
from gateway.modelsource import embedded_model_path
from tests.gateway_process import RunningGateway, gateway
from tests.lora_adapters import make_lora

pytestmark = pytest.mark.integration
if find_llama_server(None) is None:
    pytest.skip("needs llama-server (enginegate engines install llama-server)", allow_module_level=True)

ADMIN, ONLY_A = "sk-admin-lora", "sk-tone-a-only"
ASK = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    tmp = tmp_path_factory.mktemp("lora")
    a, b = (make_lora(embedded_model_path(), tmp / f"{n}.gguf", seed) for n, seed in (("a", 1), ("b", 2)))
    config = {
        "models": [{"source": str(embedded_model_path()), "name": "smollm", "engine": "llama_server",
                    "embeddings": False,
                    "options": {"threads": 1, "parallel": 2, "context_length": 2048, "log_dir": str(tmp)},
                    "adapters": [{"name": "tone-a", "path": str(a)}, {"name": "tone-b", "path": str(b)},
                                 {"name": "tone-a-off", "path": str(a), "scale": 0}]}],
        "api_keys": [{"key": ADMIN, "role": "admin", "name": "ops"},
                     {"key": ONLY_A, "models": ["tone-a"], "name": "team-a"}],
        "tenancy": {"path": str(tmp / "keys.sqlite3")},
    }
    with gateway(config_yaml=json.dumps(config)) as gw:
        yield gw


def client(gw: RunningGateway, key: str = ADMIN) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0, timeout=300)


def answer(gw: RunningGateway, model: str, key: str = ADMIN) -> str:
    """Its temperature-0 answer, the whole prompt computed (`cache_prompt` false): a prompt taken from a slot's
    cache answers a little differently (its last token is computed alone), so cached and uncached answers of
    one adapter need not be equal."""
    reply = client(gw, key).chat.completions.create(  # type: ignore[call-overload]
        model=model, messages=ASK, max_tokens=16, temperature=0, extra_body={"cache_prompt": False})
    return reply.choices[0].message.content or ""


def test_each_adapter_is_listed_with_its_base(served: RunningGateway) -> None:
    listed = {m.id: m.model_dump() for m in client(served).models.list().data}
    assert {"smollm", "tone-a", "tone-b", "tone-a-off"} <= set(listed)
    assert listed["tone-a"]["parent"] == "smollm" and listed["tone-a"]["root"].endswith("a.gguf")
    assert listed["tone-b"]["parent"] == "smollm" and "parent" not in listed["smollm"]
    # a user key sees its adapter's base by name, never the host's file path
    mine = {m.id: m.model_dump() for m in client(served, ONLY_A).models.list().data}
    assert set(mine) == {"tone-a"} and mine["tone-a"]["root"] == "tone-a"


def test_one_llama_server_loads_both_files_and_applies_none_by_default(served: RunningGateway) -> None:
    engines = [p for p in psutil.Process(served.process.pid).children(recursive=True) if "llama-server" in p.name()]
    assert len(engines) == 1
    argv = engines[0].cmdline()
    files = argv[argv.index("--lora") + 1].split(",")
    assert [Path(f).name for f in files] == ["a.gguf", "b.gguf"] and "--lora-init-without-apply" in argv


def test_base_and_adapters_answer_apart_and_the_scale_0_adapter_is_the_base(served: RunningGateway) -> None:
    first = {m: answer(served, m) for m in ("smollm", "tone-a", "tone-b", "tone-a-off")}
    again = {m: answer(served, m) for m in ("tone-b", "tone-a-off", "smollm", "tone-a")}
    assert first == again  # deterministic at temperature 0, whatever ran on the slot before
    assert len({first["smollm"], first["tone-a"], first["tone-b"]}) == 3, first
    assert first["tone-a-off"] == first["smollm"]


def test_concurrent_requests_for_the_two_adapters_each_get_their_own(served: RunningGateway) -> None:
    # llama-server never batches two slots whose adapters differ, so a request run beside the other adapter's is
    # computed exactly as alone: equal answers, byte for byte (each computes its whole prompt: `answer`). Two
    # requests of one adapter would batch together (other arithmetic), so each round runs one of each at once.
    alone = {m: answer(served, m) for m in ("tone-a", "tone-b", "smollm")}
    assert len(set(alone.values())) == 3, alone  # each adapter applied, and each its own
    for _ in range(4):
        with ThreadPoolExecutor(2) as pool:
            together = list(pool.map(lambda m: answer(served, m), ["tone-a", "tone-b"]))
        assert together == [alone["tone-a"], alone["tone-b"]], (together, alone)


def test_a_key_restricted_to_one_adapter_cannot_reach_the_others(served: RunningGateway) -> None:
    assert answer(served, "tone-a", ONLY_A)
    for other in ("tone-b", "smollm", "tone-a-off"):
        with pytest.raises(openai.NotFoundError) as err:
            answer(served, other, ONLY_A)
        assert err.value.code == "model_not_found" and str(err.value.message).endswith("served here: tone-a")


def test_usage_is_recorded_per_adapter_name(served: RunningGateway) -> None:
    answer(served, "tone-b")
    text = httpx.get(served.url + "/metrics", timeout=10).text
    models = {line.split('model="')[1].split('"')[0] for line in text.splitlines()
              if line.startswith("enginegate_prompt_tokens_total{")}
    assert {"tone-a", "tone-b"} <= models
    wanted = {("team-a", "tone-a"), ("ops", "tone-b")}
    deadline = time.monotonic() + 60  # the usage ledger is written by the gateway's flusher, every few seconds
    while True:
        rows = httpx.get(served.url + "/admin/usage", headers={"Authorization": f"Bearer {ADMIN}"},
                         timeout=10).json()["data"]
        found = {(r["name"], r["model"]) for r in rows}
        if wanted <= found or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert wanted <= found, rows


@pytest.fixture(scope="module")
def two_replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    tmp = tmp_path_factory.mktemp("lora-replicas")
    a, b = (make_lora(embedded_model_path(), tmp / f"{n}.gguf", seed) for n, seed in (("a", 1), ("b", 2)))
    config = {"models": [{"source": str(embedded_model_path()), "name": "smollm", "engine": "llama_server",
                          "embeddings": False, "replicas": 2,
                          "options": {"threads": 1, "parallel": 1, "context_length": 1024, "log_dir": str(tmp)},
                          "adapters": [{"name": "tone-a", "path": str(a)}, {"name": "tone-b", "path": str(b)}]}]}
    with gateway(config_yaml=json.dumps(config)) as gw:
        yield gw


def test_adapters_on_two_replicas_answer_alike_from_either(two_replicas: RunningGateway) -> None:
    engines = [p for p in psutil.Process(two_replicas.process.pid).children(recursive=True)
               if "llama-server" in p.name()]
    assert len(engines) == 2 and all("--lora" in p.cmdline() for p in engines)
    order = ["tone-a", "tone-b", "smollm"] * 2
    with ThreadPoolExecutor(len(order)) as pool:
        first = list(pool.map(lambda m: answer(two_replicas, m), order))
    # each replica runs one slot, so every answer is a lone request's: exact, whichever replica served it
    assert first[:3] == first[3:] and len(set(first[:3])) == 3, first
    text = httpx.get(two_replicas.url + "/metrics", timeout=10).text
    replicas = {line.split('replica="')[1].split('"')[0] for line in text.splitlines()
                if line.startswith("enginegate_routing_decisions_total{") and 'model="tone-' in line}
    assert replicas == {"0", "1"}, text  # the adapters' requests spread over both replicas
    deadline = time.monotonic() + 30  # the endpoint picker's gauges follow the gateway's poll
    while True:
        info = next((line for line in text.splitlines() if line.startswith("vllm:lora_requests_info{")), "")
        if "tone-b" in info or time.monotonic() > deadline:
            break
        time.sleep(0.5)
        text = httpx.get(two_replicas.url + "/metrics", timeout=10).text
    assert "tone-a" in info and "tone-b" in info and 'waiting_lora_adapters=""' in info, info


def _models_of_stream(events: object) -> list[str]:
    """Each streamed chunk's `model` (the Responses events: the response object's)."""
    out = []
    for event in events:  # type: ignore[attr-defined]
        model = getattr(event, "model", None)
        response = getattr(event, "response", None)
        message = getattr(event, "message", None)
        for found in (model, getattr(response, "model", None), getattr(message, "model", None)):
            if found is not None:
                out.append(found)
    return out


@pytest.mark.parametrize("model", ["tone-b", "smollm"])
def test_the_answer_names_the_model_asked_for_on_every_api(served: RunningGateway, model: str) -> None:
    """llama-server answers under its base's name (its alias); an adapter's answer names the adapter, whole and
    in every chunk, on chat, completions, Responses and Messages (through the official clients)."""
    import anthropic

    oa = client(served)
    assert oa.chat.completions.create(model=model, messages=ASK, max_tokens=4, temperature=0).model == model  # type: ignore[arg-type]
    chunks = list(oa.chat.completions.create(model=model, messages=ASK, max_tokens=4, temperature=0, stream=True,  # type: ignore[arg-type]
                                             stream_options={"include_usage": True}))
    assert len(chunks) > 2 and {c.model for c in chunks} == {model}
    assert oa.completions.create(model=model, prompt="Colours:", max_tokens=4, temperature=0).model == model
    chunks = list(oa.completions.create(model=model, prompt="Colours:", max_tokens=4, temperature=0, stream=True))
    assert len(chunks) > 2 and {c.model for c in chunks} == {model}
    assert oa.responses.create(model=model, input="Name a colour.", max_output_tokens=16, temperature=0).model == model
    seen = _models_of_stream(oa.responses.create(model=model, input="Name a colour.", max_output_tokens=16,
                                                 temperature=0, stream=True))
    assert seen and set(seen) == {model}
    claude = anthropic.Anthropic(base_url=served.url, api_key=ADMIN, max_retries=0, timeout=300)
    ask = [{"role": "user", "content": "Name a colour."}]
    assert claude.messages.create(model=model, max_tokens=4, messages=ask).model == model  # type: ignore[arg-type]
    with claude.messages.stream(model=model, max_tokens=4, messages=ask) as stream:  # type: ignore[arg-type]
        seen = _models_of_stream(stream)
        assert stream.get_final_message().model == model
    assert seen and set(seen) == {model}
