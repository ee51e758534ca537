"""Replica construction, capacity from the engine's launch, route keys, and the runtime's backends from config."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.config import ModelConfig, Settings
from gateway.routing import Admission, QueueFull, RouteKey, capacity
from gateway.routing.replicas import Instance, admission_for, instances
from gateway.request_view import view_of
from gateway.routing.route_key import prefix_text, route_key
from gateway.runtime import Runtime


def test_config_keys_as_agreed() -> None:
    config = ModelConfig.model_validate({
        "name": "smollm", "engine": "llama_server", "replicas": 2,
        "backends": [{"engine": "openai", "options": {"base_url": "http://10.0.0.5:8000/v1"}}],
        "routing": {"balance": "round_robin", "affinity": "session", "session_header": "x-conv", "load_factor": 1.5},
    })
    assert config.replicas == 2 and config.backends[0].engine == "openai"
    assert (config.routing.balance, config.routing.affinity, config.routing.load_factor) == ("round_robin", "session", 1.5)
    with pytest.raises(ValueError):
        ModelConfig.model_validate({"routing": {"affinity": "sticky"}})
    assert ModelConfig().routing.affinity == "cache"  # the default: by cost
    # a balance rule chosen and no affinity said: that rule decides (the user's setting wins)
    assert ModelConfig.model_validate({"routing": {"balance": "round_robin"}}).routing.affinity == "none"
    assert ModelConfig.model_validate({"routing": {"balance": "round_robin", "affinity": "cache"}}).routing.affinity == "cache"
    with pytest.raises(ValueError):
        ModelConfig.model_validate({"replicas": 0})


@pytest.mark.parametrize(
    ("replicas", "options", "user", "cpus", "threads"),
    [
        (1, {"threads": 8}, {}, 8, [8]),  # one replica: the plan's threads as they are
        (2, {"threads": 8}, {}, 8, [4, 4]),  # split the plan's
        (3, {}, {}, 2, [1, 1, 1]),  # nothing planned: the host's cores, at least one each
        (2, {"threads": 6}, {"threads": 6}, 8, [6, 6]),  # the user's threads are each replica's
    ],
)
def test_local_replicas_split_threads(replicas: int, options: dict[str, Any], user: dict[str, Any], cpus: int,
                                      threads: list[int]) -> None:
    config = ModelConfig(engine="llama_server", replicas=replicas)
    found = instances(config, "llama_server", options, user, [], cpus=cpus)
    assert [i.options.get("threads", cpus) for i in found] == threads
    if replicas > 1:
        assert [i.options["instance"] for i in found] == [f"r{n}" for n in range(replicas)]
        assert all(i.options["wait_for_restart"] is False for i in found)
    else:
        assert "instance" not in found[0].options


@pytest.mark.parametrize(
    ("replicas", "options", "user", "sizes"),
    [
        (1, {"cache_ram_mib": 4096}, {}, [4096]),  # one replica: the plan's prompt cache as it is
        (2, {"cache_ram_mib": 4096}, {}, [2048, 2048]),  # two: the plan's RAM shared out, not doubled
        (2, {"cache_ram_mib": 0}, {}, [0, 0]),  # off stays off
        (2, {"cache_ram_mib": 1024}, {"cache_ram_mib": 1024}, [1024, 1024]),  # the user's size is each one's
    ],
)
def test_local_replicas_share_the_planned_prompt_cache(replicas: int, options: dict[str, Any], user: dict[str, Any],
                                                       sizes: list[int]) -> None:
    found = instances(ModelConfig(engine="llama_server", replicas=replicas), "llama_server", options, user, [], cpus=2)
    assert [i.options["cache_ram_mib"] for i in found] == sizes


def test_backends_follow_the_models_replicas() -> None:
    config = ModelConfig(engine="llama_server", replicas=2)
    external = ("openai", {"base_url": "http://h:1"}, {}, False)
    found = instances(config, "llama_server", {"threads": 4}, {}, [external, external], cpus=4)
    assert [i.engine for i in found] == ["llama_server", "llama_server", "openai", "openai"]
    assert [i.local for i in found] == [True, True, False, False]
    assert "threads" not in found[2].options and found[0].options["threads"] == 2


@pytest.mark.parametrize(
    ("engine", "options", "user", "default", "slots", "source"),
    [
        ("llama_server", {"parallel": 4}, {}, 64, 4, "launch"),
        ("llama_server", {"extra_args": ["-np", "6"]}, {}, 64, 6, "launch"),
        ("llama_server", {}, {}, 64, 64, "engine default"),  # until llama-server reports its slots
        ("vllm", {"extra_args": "--max-num-seqs 48", "max_concurrency": 200}, {}, 64, 48, "launch"),
        ("vllm", {"max_concurrency": 200}, {}, 64, 200, "engine default"),  # the plan's
        ("sglang", {"max_running_requests": 32}, {}, 64, 32, "launch"),
        ("sglang", {"extra_args": ["--max-running-requests=12"]}, {}, 64, 12, "launch"),
        ("openai", {"base_url": "http://h:1"}, {}, 64, None, "none"),  # no gateway cap on an external URL
        ("openai", {"max_concurrency": 8}, {"max_concurrency": 8}, 64, 8, "user"),
        ("vllm", {"max_num_seqs": 48, "max_concurrency": 16}, {"max_concurrency": 16}, 64, 16, "user"),
    ],
)
def test_admission_from_the_engines_capacity(engine: str, options: dict[str, Any], user: dict[str, Any], default: int,
                                             slots: int | None, source: str) -> None:
    admission, found = admission_for(Instance(engine, options, user), default, 16)
    assert (admission.concurrency, found) == (slots, source)
    assert capacity.configured(engine, options, default, user) == slots


async def test_uncapped_admission_and_resize() -> None:
    free = Admission(None, 0)
    for _ in range(500):
        await free.acquire()
    assert free.running == 500 and free.waiting == 0 and not free.full
    adm = Admission(1, 2)
    await adm.acquire()
    waiters = [asyncio.create_task(adm.acquire()) for _ in range(2)]
    await asyncio.sleep(0)
    assert adm.waiting == 2 and adm.full
    with pytest.raises(QueueFull):
        await adm.acquire()
    adm.resize(3)  # the engine reported more slots: both waiters start
    await asyncio.gather(*waiters)
    assert (adm.running, adm.waiting) == (3, 0)


def test_prefix_text_is_what_a_conversation_keeps() -> None:
    system = {"role": "system", "content": "You are a pirate." * 10}
    turn1 = {"messages": [system, {"role": "user", "content": "hello"}]}
    turn2 = {"messages": [system, {"role": "user", "content": "hello"}, {"role": "assistant", "content": "arr"},
                          {"role": "user", "content": "more"}]}
    other = {"messages": [system, {"role": "user", "content": "goodbye"}]}
    assert prefix_text(view_of(turn1), 4096) == prefix_text(view_of(turn2), 4096) != prefix_text(view_of(other), 4096)
    assert prefix_text(view_of(turn1), 32) == prefix_text(view_of(other), 32)  # within a shared system prompt: one (hot) key
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]}
    assert prefix_text(view_of(parts), 100) == prefix_text(view_of({"messages": [{"role": "user", "content": "hello"}]}), 100)
    assert prefix_text(view_of({"prompt": "Once upon a time"}), 4) == "Once"
    assert prefix_text(view_of({"prompt": "x" * 5000}), 65536) == "x" * 1024  # a growing prompt keeps its start
    assert prefix_text(view_of({"prompt": [[1, 2, 3]]}), 2) == "[1,2]"
    assert prefix_text(view_of({}), 10) is None


def test_route_key_session_from_header_else_user() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "user": "u-1"}
    assert route_key(view_of(body), {"x-session-id": "s-9"}, "X-Session-Id", 100).session == "s-9"
    assert route_key(view_of(body), {}, "x-session-id", 100).session == "u-1"
    key = route_key(view_of({"messages": []}), {}, "x-session-id", 100)
    assert key == RouteKey(None, None)


def test_runtime_builds_replicas_and_an_uncapped_external(tmp_path: Any) -> None:
    settings = Settings(models=(
        ModelConfig(name="remote", engine="openai", options={"base_url": "http://127.0.0.1:9/v1"},
                    backends=({"engine": "openai", "options": {"base_url": "http://127.0.0.1:10", "max_concurrency": 3}},),
                    routing={"affinity": "prefix"}),
    ))
    backend = Runtime.build(settings).models.get("remote")
    assert backend is not None and len(backend.replicas) == 2
    assert [r.admission.concurrency for r in backend.replicas] == [None, 3]
    assert [r.capacity_from for r in backend.replicas] == ["none", "user"]
    assert [r.adapter.describe()["base_url"] for r in backend.replicas] == ["http://127.0.0.1:9", "http://127.0.0.1:10"]
    assert backend.routing.affinity == "prefix" and backend.slots is None
