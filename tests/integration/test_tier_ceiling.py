"""A key's service tier is a ceiling (issue 32, item 5), in a real gateway relaying to the emulator:
a key created with `service_tier: flex` that asks for `priority` (in the body, or in the tier header)
is queued as flex, behind another tenant's default request; the engine is told flex (the emulator,
like OpenAI, reports the tier it was asked in the response's `service_tier`, so the client reads the
tier it was served at); a key given `priority` still gets it."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import orjson
import pytest

from tests.emulators.fixture import RunningEmulator, running_emulator
from tests.gateway_process import RunningGateway, gateway
from tests.integration.test_abandoned_requests import metric, until

pytestmark = pytest.mark.integration
KEYS = ("api_keys:\n"
        "  - {key: key-flex, name: team-flex, service_tier: flex}\n"
        "  - {key: key-std, name: team-std}\n"
        "  - {key: key-top, name: team-top, service_tier: priority}\n"
        "  - {key: key-admin, name: ops, role: admin}\n")
ADMIN = {"Authorization": "Bearer key-admin"}


@pytest.fixture(scope="module")
def recorded() -> Iterator[tuple[RunningEmulator, Path]]:
    record = Path(tempfile.mkdtemp(prefix="enginegate-tiers-")) / "requests.jsonl"
    with running_emulator("vllm", "--tokens", "100000", "--itl-ms", "20", "--max-model-len", "200000",
                          "--record-requests", str(record)) as emu:
        yield emu, record


@pytest.fixture(scope="module")
def gw(recorded: tuple[RunningEmulator, Path]) -> Iterator[RunningGateway]:
    emu, _ = recorded
    config = (KEYS + "models:\n  - source: remote\n    name: single\n    engine: openai\n    max_queue: 16\n"
              f'    options: {{base_url: "{emu.url}", upstream_model: emulated-model, max_concurrency: 1}}\n')
    with gateway(config_yaml=config) as running:
        yield running


def client(url: str, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)


async def waiting(http: httpx.AsyncClient, url: str) -> dict[str, int]:
    stats = (await http.get(url + "/v1/gateway/stats", headers=ADMIN)).json()
    return stats["models"]["single"]["scheduler"]["waiting"]


async def test_a_flex_key_asking_priority_is_queued_and_served_as_flex(
        gw: RunningGateway, recorded: tuple[RunningEmulator, Path]) -> None:
    _, record = recorded
    hi = [{"role": "user", "content": "hi"}]
    flex, std, top = client(gw.url, "key-flex"), client(gw.url, "key-std"), client(gw.url, "key-top")
    ended: dict[str, float] = {}

    async def ask(label: str, api: openai.AsyncOpenAI, **extra: object) -> str | None:
        answer = await api.chat.completions.create(model="single", messages=hi, max_tokens=2, **extra)  # type: ignore[call-overload]
        ended[label] = time.monotonic()
        return answer.service_tier  # type: ignore[no-any-return]

    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as http:
        holder = asyncio.create_task(std.chat.completions.create(model="single", messages=hi, max_tokens=100000,
                                                                 stream=True))
        await until(lambda: _running(http, gw.url), "the one slot taken")
        queued = {}
        for label, api, extra in (
                ("flex-body", flex, {"service_tier": "priority"}),
                ("flex-header", flex, {"extra_headers": {"x-enginegate-service-tier": "priority"}}),
                ("flex-priority-field", flex, {"service_tier": "priority", "extra_body": {"priority": -100}}),
                ("std-asks-priority", std, {"service_tier": "priority"}),
                ("top", top, {"service_tier": "priority"})):
            queued[label] = asyncio.create_task(ask(label, api, **extra))
            await until(lambda n=len(queued): _waiting_total(http, gw.url, n), f"{label} queued")
        by_tier = await waiting(http, gw.url)
        stream = await holder
        await stream.close()  # the slot frees: the queue drains in tier order
        tiers = {label: await task for label, task in queued.items()}
        text = (await http.get(gw.url + "/metrics", headers=ADMIN)).text
    # the flex key's three asks are flex, the tierless key's is default (its ceiling), the priority key's priority
    assert by_tier == {"priority": 1, "default": 1, "flex": 3}
    assert sorted(ended, key=ended.__getitem__)[:2] == ["top", "std-asks-priority"]
    # what the client reads back is the tier it was served at (the engine was told that one), never the one asked
    assert tiers == {"flex-body": "flex", "flex-header": None, "flex-priority-field": "flex",
                     "std-asks-priority": "default", "top": "priority"}
    assert metric(text, "enginegate_scheduler_queue_wait_seconds_count", model="single", service_tier="flex") == 3
    assert metric(text, "enginegate_scheduler_queue_wait_seconds_count", model="single", service_tier="priority") == 1
    sent = [orjson.loads(line)["body"] for line in record.read_bytes().splitlines()]
    assert not [b for b in sent if "priority" in b]  # the client's own engine priority never reached the engine
    assert sorted(str(b.get("service_tier")) for b in sent) == ["None", "None", "default", "flex", "flex", "priority"]


async def _running(http: httpx.AsyncClient, url: str) -> bool:
    text = (await http.get(url + "/metrics", headers=ADMIN)).text
    return metric(text, "enginegate_generations_running", model="single") == 1


async def _waiting_total(http: httpx.AsyncClient, url: str, n: int) -> bool:
    return sum((await waiting(http, url)).values()) == n
