"""Tenancy the way it runs in production: two `enginegate serve` processes sharing one real
redis-server, in front of the engine emulator. Limits hold across both (not doubled), revocation
reaches both, the official clients retry after a 429 by themselves, losing redis gives 503 (never
a 500) and loses no usage, and no secret shows anywhere."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.request_view import view_of
from tests.emulators.fixture import RunningEmulator, running_emulator
from tests.gateway_process import RunningGateway, gateway
from tests.redis_server import RedisServer, redis_server

pytestmark = pytest.mark.integration
ADMIN_SECRET = "admin-secret-7f3a9c1e5b2d"
ADMIN = {"Authorization": f"Bearer {ADMIN_SECRET}"}
MODEL = "relayed"
MAX_TOKENS = 8
SECRETS: list[str] = [ADMIN_SECRET]  # every secret this module made: none may show in logs, metrics or errors


@pytest.fixture(scope="module")
def upstream() -> Iterator[RunningEmulator]:
    with running_emulator("vllm", "--tokens", str(MAX_TOKENS)) as emu:
        yield emu


@pytest.fixture(scope="module")
def slow_upstream() -> Iterator[RunningEmulator]:
    with running_emulator("vllm", "--tokens", "200", "--itl-ms", "20") as emu:
        yield emu


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


def config(upstream: RunningEmulator, slow: RunningEmulator, redis: RedisServer) -> str:
    return (f"api_keys:\n  - {{key: {ADMIN_SECRET}, role: admin, name: ops}}\n"
            f"tenancy: {{redis_url: \"{redis.url}\", key_metrics: true, store_timeout_seconds: 0.5}}\n"
            "models:\n  - source: remote\n    name: relayed\n    engine: openai\n    max_queue: 512\n"
            f"    options: {{base_url: \"{upstream.url}\", upstream_model: emulated-model}}\n"
            "  - source: remote\n    name: slow\n    engine: openai\n"
            f"    options: {{base_url: \"{slow.url}\", upstream_model: emulated-model}}\n")


@pytest.fixture(scope="module")
def gateways(upstream: RunningEmulator, slow_upstream: RunningEmulator,
             redis: RedisServer) -> Iterator[tuple[RunningGateway, RunningGateway]]:
    yaml = config(upstream, slow_upstream, redis)
    with gateway(config_yaml=yaml) as one, gateway(["--log-level", "debug"], config_yaml=yaml) as two:
        yield one, two


def create_key(gw: RunningGateway, name: str, **policy: Any) -> str:
    r = httpx.post(gw.url + "/admin/keys", json={"name": name, **policy}, headers=ADMIN, timeout=10)
    assert r.status_code == 200, r.text
    SECRETS.append(r.json()["key"])
    return str(r.json()["key"])


def chat_body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": MAX_TOKENS, **extra}


async def burst(urls: list[str], secret: str, n: int, **extra: Any) -> list[httpx.Response]:
    """n requests at once, spread over the gateways in turn."""
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=n)) as client:
        return await asyncio.gather(*(client.post(urls[i % len(urls)] + "/v1/chat/completions", json=chat_body(**extra),
                                                  headers={"Authorization": f"Bearer {secret}"}) for i in range(n)))


def usage(gw: RunningGateway, key: str) -> Counter[str]:
    """The key's usage summed over models and days (0 for what it has none of)."""
    rows = httpx.get(gw.url + "/admin/usage", params={"key": key}, headers=ADMIN, timeout=10).json()["data"]
    total: Counter[str] = Counter()
    for row in rows:
        total.update({k: v for k, v in row.items() if isinstance(v, int)})
    return total


def test_a_per_minute_limit_holds_across_two_gateways(gateways: tuple[RunningGateway, RunningGateway]) -> None:
    one, two = gateways
    secret = create_key(one, "burst", rpm=60)
    answers = asyncio.run(burst([one.url, two.url], secret, 150))
    statuses = Counter(r.status_code for r in answers)
    print(f"\nrpm 60 across two gateways, 150 requests at once: {dict(statuses)}")
    assert statuses == {200: 60, 429: 90}  # exactly the limit, not 60 per process
    refused = next(r for r in answers if r.status_code == 429)
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert 0 < int(refused.headers["retry-after"]) <= 60 and refused.headers["x-ratelimit-remaining-requests"] == "0"
    ok = next(r for r in answers if r.status_code == 200)
    assert ok.headers["x-ratelimit-limit-requests"] == "60" and "x-ratelimit-reset-requests" in ok.headers
    # both gateways answered the burst (which of them wins the shared bucket is timing: once one won all 60)
    assert {r.request.url.port for r in answers} == {one.port, two.port}
    assert usage(two, "burst")["requests"] == 60 and usage(one, "burst")["rejected"] == 90


def decided_in_gateway(gw: RunningGateway) -> float:
    text = httpx.get(gw.url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith('enginegate_limit_decisions_total{where="gateway"}'))


def test_a_busy_keys_allotments_hold_its_limit_exactly_across_two_gateways(
        gateways: tuple[RunningGateway, RunningGateway]) -> None:
    """Clients sending one request after another through both gateways: a busy key, whose requests the gateways
    admit from allotments the store grants ahead of need (docs/keys.md#allotments-a-busy-key-decided-in-the-gateway).
    Exactly the limit is served over both, and most of it without a store round trip."""
    one, two = gateways
    secret = create_key(one, "allotted", rpm=240, max_concurrency=8, budget_tokens=1_000_000)
    before = decided_in_gateway(one) + decided_in_gateway(two)

    async def client(url: str, n: int) -> list[int]:
        async with httpx.AsyncClient(timeout=60) as c:
            return [(await c.post(url + "/v1/chat/completions", json=chat_body(),
                                  headers={"Authorization": f"Bearer {secret}"})).status_code for _ in range(n)]

    async def clients() -> list[list[int]]:
        return await asyncio.gather(*(client(url, 80) for url in (one.url, two.url, one.url, two.url)))

    statuses = Counter(code for codes in asyncio.run(clients()) for code in codes)
    decided = decided_in_gateway(one) + decided_in_gateway(two) - before
    print(f"\nrpm 240, 4 clients x 80 requests one after another over two gateways: {dict(statuses)}, "
          f"{decided:.0f} decided in a gateway")
    assert statuses == {200: 240, 429: 80}
    assert decided > 120


def test_a_token_budget_is_not_overspent_beyond_the_requests_in_flight(gateways: tuple[RunningGateway, RunningGateway]) -> None:
    """Each request reserves its prompt's estimate plus max_tokens and the settle refunds the rest: the emulator
    counts a prompt's words (1 here), far under the estimate, so the bound (the estimate's error) is 0 and the
    waves go on, refund by refund, until one is refused whole with the budget as good as spent."""
    one, two = gateways
    budget, wave = 300, 10
    cost = view_of(chat_body()).prompt_tokens + MAX_TOKENS
    secret = create_key(two, "budget", budget_tokens=budget, budget_period="day")
    codes: Counter[str] = Counter()
    served = -1
    while served != codes["ok"]:
        served = codes["ok"]
        for r in asyncio.run(burst([one.url, two.url], secret, wave)):
            assert r.status_code in (200, 429), r.text
            codes["ok" if r.status_code == 200 else r.json()["error"]["code"]] += 1
        assert codes["ok"] < budget, "the budget never ran out"
        deadline = time.monotonic() + 30
        while usage(one, "budget")["requests"] < codes["ok"]:  # each settle (its refund) follows its response
            assert time.monotonic() < deadline, "served requests were never settled"
            time.sleep(0.05)
    spent = usage(one, "budget")
    total = spent["prompt_tokens"] + spent["completion_tokens"]
    print(f"\nbudget {budget} tokens, waves of {wave} requests (max_tokens {MAX_TOKENS}) over two gateways: "
          f"spent {total} ({total - budget:+d}), {codes['ok']} served")
    assert budget - cost < total <= budget
    after = asyncio.run(burst([one.url, two.url], secret, 2))
    assert all(r.status_code == 429 and r.headers["x-should-retry"] == "false" for r in after)


def test_a_stream_the_client_leaves_is_charged_what_it_received(gateways: tuple[RunningGateway, RunningGateway]) -> None:
    one, _ = gateways
    secret = create_key(one, "leaver", models=["slow"], tpm=100_000)
    body = {"model": "slow", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with httpx.stream("POST", one.url + "/v1/chat/completions", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {secret}"}) as r:
        assert r.status_code == 200
        events = 0
        for line in r.iter_lines():
            events += line.startswith("data: ")
            if events == 10:
                break  # and close the connection: 190 tokens never sent
    deadline = time.monotonic() + 30
    while not usage(one, "leaver")["requests"]:
        assert time.monotonic() < deadline, "the abandoned stream was never settled"
        time.sleep(0.1)
    spent = usage(one, "leaver")
    assert 9 <= spent["completion_tokens"] < 100, spent  # what it received, not 0 and not all 200
    hidden = httpx.get(one.url + "/v1/models", headers={"Authorization": f"Bearer {secret}"}, timeout=10).json()
    assert [m["id"] for m in hidden["data"]] == ["slow"]  # `relayed` is not this key's
    r = httpx.post(one.url + "/v1/chat/completions", json=chat_body(), headers={"Authorization": f"Bearer {secret}"}, timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert r.json()["error"]["message"].endswith("served here: slow")  # the others are not listed either


def test_a_revoked_key_fails_on_its_next_request_in_every_gateway(gateways: tuple[RunningGateway, RunningGateway]) -> None:
    one, two = gateways
    secret = create_key(one, "short-lived")
    auth = {"Authorization": f"Bearer {secret}"}
    for gw in gateways:
        assert httpx.post(gw.url + "/v1/chat/completions", json=chat_body(), headers=auth, timeout=30).status_code == 200
    assert httpx.post(two.url + "/admin/keys/short-lived/revoke", headers=ADMIN, timeout=10).status_code == 200
    for gw in gateways:
        r = httpx.post(gw.url + "/v1/chat/completions", json=chat_body(), headers=auth, timeout=30)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_when_the_push_connection_dies_no_gateway_accepts_a_key_revoked_meanwhile(
        gateways: tuple[RunningGateway, RunningGateway], redis: RedisServer) -> None:
    """The subscriptions killed by the server: each gateway drops its cache and caches nothing until it is
    subscribed again, so a key (no limits: only the cache stands in the way) revoked meanwhile is refused at once."""
    import redis as redis_client

    one, two = gateways
    admin = redis_client.Redis.from_url(redis.url)
    try:
        for round_ in range(3):
            secret = create_key(one, f"unpushed-{round_}")
            auth = {"Authorization": f"Bearer {secret}"}
            for gw in gateways:
                assert httpx.post(gw.url + "/v1/chat/completions", json=chat_body(), headers=auth, timeout=30).status_code == 200
            assert admin.client_kill_filter(_type="pubsub") >= 2  # one subscriber per gateway
            assert httpx.post(two.url + f"/admin/keys/unpushed-{round_}/revoke", headers=ADMIN, timeout=10).status_code == 200
            for gw in gateways:
                r = httpx.post(gw.url + "/v1/chat/completions", json=chat_body(), headers=auth, timeout=30)
                assert r.status_code == 401, f"round {round_}: a key revoked while the push was down was accepted"
        deadline = time.monotonic() + 10  # the subscriptions come back by themselves
        while len(admin.pubsub_channels()) < 1 or admin.pubsub_numsub("enginegate:keys-changed")[0][1] < 2:
            assert time.monotonic() < deadline, "the gateways did not subscribe again"
            time.sleep(0.1)
    finally:
        admin.close()


def test_the_official_clients_retry_after_a_429_and_succeed(gateways: tuple[RunningGateway, RunningGateway]) -> None:
    one, two = gateways
    secret = create_key(one, "retrying", rpm=1, window_seconds=2)
    client = openai.OpenAI(base_url=one.base_url, api_key=secret, max_retries=3)
    messages: Any = [{"role": "user", "content": "hi"}]
    first = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages, max_tokens=2)
    assert first.headers["x-ratelimit-remaining-requests"] == "0"
    started = time.monotonic()
    second = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)  # 429, waits, retries
    assert second.choices[0].message.content and time.monotonic() - started >= 0.5
    assert usage(one, "retrying")["rejected"] >= 1

    secret = create_key(two, "retrying-anthropic", rpm=1, window_seconds=2)
    claude = anthropic.Anthropic(base_url=two.url, api_key=secret, max_retries=3)
    raw = claude.messages.with_raw_response.create(model=MODEL, max_tokens=2, messages=messages)
    assert raw.headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert raw.headers["anthropic-ratelimit-requests-reset"].endswith("Z")
    assert claude.messages.create(model=MODEL, max_tokens=2, messages=messages).content
    assert usage(two, "retrying-anthropic")["rejected"] >= 1
    no_retry = anthropic.Anthropic(base_url=two.url, api_key=secret, max_retries=0)
    with pytest.raises(anthropic.RateLimitError) as info:
        for _ in range(3):
            no_retry.messages.create(model=MODEL, max_tokens=2, messages=messages)
    assert info.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]


def test_losing_redis_answers_503_never_500_and_loses_no_usage(gateways: tuple[RunningGateway, RunningGateway],
                                                             redis: RedisServer) -> None:
    one, two = gateways
    secret = create_key(one, "outage", rpm=1000)
    auth = {"Authorization": f"Bearer {secret}"}
    before = usage(one, "ops")["requests"]
    redis.kill()
    try:
        for gw in gateways:
            r = httpx.post(gw.url + "/v1/chat/completions", json=chat_body(), headers=auth, timeout=30)
            assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable" and "retry-after" in r.headers
            m = httpx.post(gw.url + "/v1/messages", json={"model": MODEL, "max_tokens": 2, "messages": [
                {"role": "user", "content": "hi"}]}, headers={"x-api-key": secret}, timeout=30)
            assert m.status_code == 503 and m.json()["type"] == "error"
            # the config file's key needs no store to authenticate; its usage waits in memory
            ok = httpx.post(gw.url + "/v1/chat/completions", json=chat_body(), headers=ADMIN, timeout=30)
            assert ok.status_code == 200
            assert httpx.get(gw.url + "/admin/usage", headers=ADMIN, timeout=30).status_code == 503
    finally:
        redis.start()
    deadline = time.monotonic() + 30
    while httpx.post(two.url + "/v1/chat/completions", json=chat_body(), headers=auth, timeout=30).status_code != 200:
        assert time.monotonic() < deadline, "the gateway did not come back with redis"
        time.sleep(0.2)
    deadline = time.monotonic() + 30
    while usage(one, "ops")["requests"] < before + 2:  # the two buffered requests, written when redis came back
        assert time.monotonic() < deadline, "buffered usage was not written"
        time.sleep(0.2)
    for gw in gateways:
        assert "Traceback" not in gw.log()


def test_no_secret_in_logs_metrics_errors_or_the_key_list(gateways: tuple[RunningGateway, RunningGateway]) -> None:
    one, two = gateways
    assert len(SECRETS) > 3
    seen: list[str] = []
    for gw in gateways:
        wrong = httpx.post(gw.url + "/v1/chat/completions", json=chat_body(), timeout=10,
                           headers={"Authorization": f"Bearer {SECRETS[-1]}x"})
        assert wrong.status_code == 401
        seen += [wrong.text, gw.log(), gw.metrics(),
                 httpx.get(gw.url + "/admin/keys", headers=ADMIN, timeout=10).text,
                 httpx.get(gw.url + "/admin/usage", headers=ADMIN, timeout=10).text,
                 httpx.get(gw.url + "/ready", headers=ADMIN, timeout=10).text]
    assert 'key="burst"' in seen[2]  # key_metrics: by name (served or refused, as the shared bucket fell)
    for text in seen:
        for secret in SECRETS:
            assert secret not in text
            assert secret[:12] not in text
