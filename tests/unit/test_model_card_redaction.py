"""/v1/models shows a user key the model's facts, never the host's: the weights' absolute path, engine
process ids, ports, URLs, log files (issue 32, item 7). Admins, and a gateway without keys, see all."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from gateway.api.redact import hide_internals
from gateway.app import create_app
from gateway.config import Settings
from gateway.runtime import runtime_for_adapters
from tests.fakes import EchoAdapter

HOST_FACTS = {"path": "/home/alice/models/secret-finetune-q4.gguf", "pid": 4242, "port": 38111,
              "log_path": "/root/.cache/enginegate/logs/llama_server-m.log", "base_url": "http://10.0.0.7:8000/v1",
              "detail": "ready: pid 4242 on port 38111", "container_image": "registry.internal/vllm:1",
              "kv_events_endpoint": "tcp://10.0.0.7:5557", "worker": {"pid": 99}, "upstream_model": "/srv/m"}
MODEL_FACTS = {"context_length": 8192, "trained_context_length": 32768, "embedding_length": 576, "vocab_size": 49152,
               "engine": "echo", "state": "ready", "restarts": 0}


class Described(EchoAdapter):
    def describe(self) -> dict[str, Any]:
        return {**HOST_FACTS, **MODEL_FACTS}


def cards(settings: Settings, key: str | None) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with TestClient(create_app(settings, runtime_for_adapters(settings, {"m": Described()}))) as client:
        listed = client.get("/v1/models", headers=headers)
        one = client.get("/v1/models/m", headers=headers)
    assert listed.status_code == one.status_code == 200
    return [listed.json()["data"][0], one.json()]


KEYS = Settings(api_keys=("user-key", {"key": "admin-key", "role": "admin"}))


def test_a_user_key_sees_the_models_facts_and_nothing_of_the_host() -> None:
    for card in cards(KEYS, "user-key"):
        assert card["id"] == "m" and card["meta"] == MODEL_FACTS
        text = str(card)
        for secret in ("/home/alice", "secret-finetune", "4242", "38111", "10.0.0.7", ".cache", "registry.internal"):
            assert secret not in text


@pytest.mark.parametrize(("settings", "key"), [(KEYS, "admin-key"), (Settings(), None)])
def test_an_operator_sees_everything(settings: Settings, key: str | None) -> None:
    for card in cards(settings, key):
        assert card["meta"] == {**HOST_FACTS, **MODEL_FACTS}


@pytest.mark.parametrize(("text", "shown"), [
    ("ready: pid 4242 on port 38111 (upstream http://10.0.0.7:8000/v1)", "ready: pid * on port * (upstream *)"),
    ("cannot open /home/alice/models/x.gguf: no such file", "cannot open *: no such file"),
    ("see ~/.cache/enginegate/logs/a.log", "see *"),
    ("events at tcp://10.0.0.7:5557, redis://:pw@cache:6379/0", "events at *, *"),
    ("Qwen/Qwen2.5-0.5B-Instruct and a/b", "Qwen/Qwen2.5-0.5B-Instruct and a/b"),  # model ids are no paths
    ("set in the model's config", "set in the model's config"),
])
def test_hide_internals(text: str, shown: str) -> None:
    assert hide_internals(text) == shown
