"""The scheduler in a real gateway process relaying to the emulator (cheap, exact timing): a flood
from one client does not refuse or delay another (and under `policy: fifo`, the old behaviour, it
does), a deadline that passes in the queue answers 504, a client that gives up leaves the queue,
and SIGTERM serves queued requests by tier within the grace period."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.emulators.fixture import RunningEmulator, running_emulator
from tests.gateway_process import RunningGateway, gateway
from tests.integration.test_abandoned_requests import metric, until

pytestmark = pytest.mark.integration
ITL_MS = 20
FLOW = "x-enginegate-flow"


@pytest.fixture(scope="module")
def upstream() -> Iterator[RunningEmulator]:
    with running_emulator("vllm", "--tokens", "100000", "--itl-ms", str(ITL_MS), "--max-model-len", "200000") as emu:
        yield emu


def config(upstream: RunningEmulator, policy: str = "fair", grace: float = 30.0) -> str:
    relay = f'options: {{base_url: "{upstream.url}", upstream_model: emulated-model, max_concurrency: SLOTS}}'
    models = "".join(
        f"  - source: remote\n    name: {name}\n    engine: openai\n    max_queue: 16\n"
        f"    scheduler: {{policy: {policy}}}\n    {relay.replace('SLOTS', str(slots))}\n"
        for name, slots in (("flood", 4), ("single", 1), ("pair", 2)))
    return f"shutdown_grace_seconds: {grace}\nmodels:\n{models}"


@pytest.fixture(scope="module", params=["fair", "fifo"])
def relayed(request: pytest.FixtureRequest, upstream: RunningEmulator) -> Iterator[tuple[str, RunningGateway]]:
    with gateway(config_yaml=config(upstream, request.param)) as running:
        yield request.param, running


def chat(model: str, max_tokens: int, stream: bool = True, **extra: object) -> dict[str, object]:
    return {"model": model, "stream": stream, "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}],
            **extra}


@dataclass
class Outcome:
    status: int
    sent: float
    first: float | None = None
    end: float | None = None


async def stream(http: httpx.AsyncClient, url: str, body: dict[str, object], headers: dict[str, str]) -> Outcome:
    out = Outcome(0, time.monotonic())
    async with http.stream("POST", url + "/v1/chat/completions", json=body, headers=headers) as response:
        out.status = response.status_code
        async for line in response.aiter_lines():
            if line.startswith("data: ") and b'"content"' in line.encode() and out.first is None:
                out.first = time.monotonic()
    out.end = time.monotonic()
    return out


async def test_a_flood_from_one_client_neither_refuses_nor_delays_another(relayed: tuple[str, RunningGateway]) -> None:
    policy, gw = relayed
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as http:
        await stream(http, gw.url, chat("flood", 2), {FLOW: "B"})  # B used the gateway before (its idle request)
        a = [asyncio.create_task(stream(http, gw.url, chat("flood", 50), {FLOW: "A"})) for _ in range(40)]
        await asyncio.sleep(0.5)
        b = await stream(http, gw.url, chat("flood", 5), {FLOW: "B"})
        flood = await asyncio.gather(*a)
        text = await http.get(gw.url + "/metrics")
    served = [o for o in flood if o.status == 200]
    assert {o.status for o in flood} <= {200, 429} and len(served) >= 16
    if policy == "fifo":  # first come, first served: the burst filled the queue, the other client is refused
        assert b.status == 429
        return
    assert b.status == 200 and b.first is not None
    # B overtook every request of A's still queued when it arrived: none of them started before B's first token
    assert not [o for o in served if o.first is not None and b.sent < o.first < b.first and o.sent < b.sent - 0.4]
    # the full queue refused A's newest request to make room for B, and A's own excess with queue_full
    assert metric(text.text, "enginegate_scheduler_refusals_total", model="flood", reason="flow_share") == 1
    assert metric(text.text, "enginegate_scheduler_refusals_total", model="flood", reason="queue_full") == 40 - len(served) - 1


async def test_a_deadline_that_passes_in_the_queue_answers_504(relayed: tuple[str, RunningGateway]) -> None:
    policy, gw = relayed
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as http:
        holder = asyncio.create_task(stream(http, gw.url, chat("single", 100000), {}))
        await until(lambda: _is(http, gw.url, "enginegate_generations_running", "single", 1), "the slot taken")
        late = await http.post(gw.url + "/v1/chat/completions", json=chat("single", 2, stream=False),
                               headers={"x-enginegate-deadline-ms": "300"})
        assert late.status_code == 504 and late.json()["error"]["code"] == "deadline_exceeded"
        bad = await http.post(gw.url + "/v1/chat/completions", json=chat("single", 2, stream=False),
                              headers={"x-enginegate-deadline-ms": "soon"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "x-enginegate-deadline-ms"
        # a client that gives up leaves the queue at once (its place is not held until the slot frees)
        gone = asyncio.create_task(http.post(gw.url + "/v1/chat/completions", json=chat("single", 2, stream=False)))
        await until(lambda: _is(http, gw.url, "enginegate_queue_waiting", "single", 1), "one request queued")
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        await until(lambda: _is(http, gw.url, "enginegate_queue_waiting", "single", 0), "the queue empty again")
        holder.cancel()
        await asyncio.gather(holder, return_exceptions=True)
        met = await http.post(gw.url + "/v1/chat/completions", json=chat("single", 2, stream=False),
                              headers={"x-enginegate-deadline-ms": "60000"})
        assert met.status_code == 200
        stats = (await http.get(gw.url + "/v1/gateway/stats")).json()["models"]["single"]["scheduler"]
    assert stats["refusals"]["deadline"] == 1 and stats["policy"] == policy
    assert set(stats["waiting"]) == {"priority", "default", "flex"}


async def _is(http: httpx.AsyncClient, url: str, name: str, model: str, value: float) -> bool:
    return metric((await http.get(url + "/metrics")).text, name, model=model) == value


async def test_sigterm_serves_queued_requests_by_tier_within_the_grace(upstream: RunningEmulator) -> None:
    grace = 5.0
    with gateway(config_yaml=config(upstream, grace=grace)) as gw:
        async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as http:
            forever = asyncio.create_task(stream(http, gw.url, chat("pair", 100000), {}))
            medium = asyncio.create_task(stream(http, gw.url, chat("pair", 1000 // ITL_MS), {}))  # ~1 s
            await until(lambda: _is(http, gw.url, "enginegate_generations_running", "pair", 2), "both slots taken")
            queued = {}
            for tier in ("flex", "default", "priority"):  # arrival order: the lowest first
                queued[tier] = asyncio.create_task(stream(http, gw.url, chat("pair", 5, service_tier=tier), {}))
                await until(lambda n=len(queued): _is(http, gw.url, "enginegate_queue_waiting", "pair", n), "queued")
            by_tier = (await http.get(gw.url + "/v1/gateway/stats")).json()["models"]["pair"]["scheduler"]["waiting"]
            assert by_tier == {"priority": 1, "default": 1, "flex": 1}
            os.kill(gw.process.pid, signal.SIGTERM)
            done = {tier: await task for tier, task in queued.items()}
            long_run = await forever
            assert (await medium).status == 200
        assert gw.process.wait(timeout=60) in (0, -signal.SIGTERM)
        log = gw.log()
    assert all(o.status == 200 and o.first is not None for o in done.values())
    ends = sorted(done, key=lambda tier: done[tier].end or 0.0)
    assert ends == ["priority", "default", "flex"]  # served in tier order after the medium stream's slot freed
    assert long_run.status == 200  # the endless stream was ended at the grace's end (an error event, then the end)
    assert "drain grace over: ending 1 request(s)" in log and "Traceback" not in log



async def test_keys_are_the_flows_and_a_header_cannot_borrow_another_tenants_share(upstream: RunningEmulator) -> None:
    """Tenancy (issue 22) meets scheduling (23): with keys, the flow is the key's name, so team A's
    burst, even sent with team B's flow header, is refused to team A, and team B is served at once."""
    keys = ("api_keys:\n  - {key: key-team-a, name: team-a}\n  - {key: key-team-b, name: team-b}\n"
            "  - {key: key-admin, name: ops, role: admin}\n")
    as_a = {"Authorization": "Bearer key-team-a", FLOW: "team-b"}  # the header is ignored for a keyed caller
    as_b = {"Authorization": "Bearer key-team-b"}
    with gateway(config_yaml=keys + config(upstream)) as gw:
        async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as http:
            await stream(http, gw.url, chat("flood", 2), as_b)  # B used the gateway before
            a = [asyncio.create_task(stream(http, gw.url, chat("flood", 50), as_a)) for _ in range(40)]
            await asyncio.sleep(0.5)
            b = await stream(http, gw.url, chat("flood", 5), as_b)
            flood = await asyncio.gather(*a)
            text = (await http.get(gw.url + "/metrics", headers={"Authorization": "Bearer key-admin"})).text
    served = [o for o in flood if o.status == 200]
    assert b.status == 200 and b.first is not None
    assert not [o for o in served if o.first is not None and b.sent < o.first < b.first and o.sent < b.sent - 0.4]
    assert metric(text, "enginegate_scheduler_refusals_total", model="flood", reason="flow_share") == 1
    assert metric(text, "enginegate_scheduler_refusals_total", model="flood", reason="queue_full") == 40 - len(served) - 1
