"""A token budget under concurrency, end to end: real gateway processes serving the embedded model
(SmolLM2 on llama.cpp), their keys on one SQLite file or one real redis-server, the official
openai client. Admission reserves each request's prompt estimate plus max_tokens x n and the
settle refunds what it did not use, so spent tokens stay within the bound gateway/tenancy/limits.py
and docs/keys.md state: the prompt estimate's error, per request in flight."""

from __future__ import annotations

import asyncio
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.request_view import view_of
from tests.gateway_process import RunningGateway, gateway
from tests.redis_server import RedisServer, redis_server

pytestmark = pytest.mark.integration
ADMIN_SECRET = "admin-secret-budget-b0und"
ADMIN = {"Authorization": f"Bearer {ADMIN_SECRET}"}
MODEL = "smollm"
MESSAGES = [{"role": "user", "content": "Write a short poem about the sea."}]
BUDGET, MAX_TOKENS, AT_ONCE = 300, 16, 30


def config(store: str) -> str:
    return (f"api_keys:\n  - {{key: {ADMIN_SECRET}, role: admin, name: ops}}\n"
            f"tenancy: {store}\n"
            f"models:\n  - source: default\n    name: {MODEL}\n    engine: llamacpp\n    threads: 1\n    max_queue: 64\n")


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


@pytest.fixture(scope="module")
def sqlite_pair() -> Iterator[tuple[RunningGateway, RunningGateway]]:
    path = Path(tempfile.mkdtemp(prefix="enginegate-budget-")) / "keys.sqlite3"
    yaml = config(f'{{path: "{path}"}}')
    with ExitStack() as stack:
        yield stack.enter_context(gateway(config_yaml=yaml)), stack.enter_context(gateway(config_yaml=yaml))


@pytest.fixture(scope="module")
def redis_pair(redis: RedisServer) -> Iterator[tuple[RunningGateway, RunningGateway]]:
    yaml = config(f'{{redis_url: "{redis.url}", redis_prefix: "b{uuid.uuid4().hex[:8]}:"}}')
    with ExitStack() as stack:
        yield stack.enter_context(gateway(config_yaml=yaml)), stack.enter_context(gateway(config_yaml=yaml))


def create_key(gw: RunningGateway, **policy: Any) -> tuple[str, str]:
    name = f"k{uuid.uuid4().hex[:10]}"
    r = httpx.post(gw.url + "/admin/keys", json={"name": name, **policy}, headers=ADMIN, timeout=10)
    assert r.status_code == 200, r.text
    return name, str(r.json()["key"])


def spent(gw: RunningGateway, name: str, requests: int) -> int:
    """The key's prompt + completion tokens once `requests` have settled (the settle follows the response)."""
    deadline = time.monotonic() + 30
    while True:
        rows = httpx.get(gw.url + "/admin/usage", params={"key": name}, headers=ADMIN, timeout=10).json()["data"]
        if sum(r["requests"] for r in rows) >= requests or time.monotonic() > deadline:
            return sum(r["prompt_tokens"] + r["completion_tokens"] for r in rows)
        time.sleep(0.1)


async def burst(gateways: list[RunningGateway], secret: str, n: int) -> Counter[str]:
    clients = [openai.AsyncOpenAI(base_url=g.base_url, api_key=secret, max_retries=0, timeout=120) for g in gateways]

    async def one(i: int) -> str:
        try:
            await clients[i % len(clients)].chat.completions.create(model=MODEL, messages=MESSAGES,  # type: ignore[arg-type]
                                                                    max_tokens=MAX_TOKENS)
            return "ok"
        except openai.RateLimitError as exc:
            return str(exc.code)

    try:
        return Counter(await asyncio.gather(*(one(i) for i in range(n))))
    finally:
        for c in clients:
            await c.close()


def estimate_error(gw: RunningGateway) -> int:
    """How many prompt tokens the engine counts over the estimate for this request (0 when the estimate covers it)."""
    answer = openai.OpenAI(base_url=gw.base_url, api_key=ADMIN_SECRET, max_retries=0).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=1)  # type: ignore[arg-type]
    assert answer.usage is not None
    return max(0, answer.usage.prompt_tokens - view_of({"messages": MESSAGES}).prompt_tokens)


@pytest.mark.parametrize(("store", "processes"), [("sqlite", 1), ("redis", 1), ("sqlite", 2), ("redis", 2)])
def test_thirty_at_once_never_overspend_the_budget_beyond_the_bound(request: pytest.FixtureRequest, store: str,
                                                                    processes: int) -> None:
    pair: tuple[RunningGateway, RunningGateway] = request.getfixturevalue(f"{store}_pair")
    gateways = list(pair[:processes])
    error = estimate_error(gateways[0])
    name, secret = create_key(gateways[0], budget_tokens=BUDGET, budget_period="day")
    outcomes: Counter[str] = Counter()
    for _ in range(2):  # the second wave finds what the first one's refunds left
        outcomes += asyncio.run(burst(gateways, secret, AT_ONCE))
    total = spent(gateways[-1], name, outcomes["ok"])
    bound = error * outcomes["ok"]  # every served request in flight at once: the bound's worst case
    print(f"\n{store}, {processes} process(es): {AT_ONCE} at once x2, max_tokens {MAX_TOKENS}, budget {BUDGET}: "
          f"{dict(outcomes)}, spent {total} (bound {BUDGET + bound}; the engine counts {error} over the estimate)")
    assert set(outcomes) == {"ok", "insufficient_quota"}
    assert outcomes["ok"] >= 3 and total <= BUDGET + bound


def test_a_request_whose_choices_cannot_fit_is_refused(sqlite_pair: tuple[RunningGateway, RunningGateway]) -> None:
    one, _ = sqlite_pair
    name, secret = create_key(one, budget_tokens=50, budget_period="day")
    client = openai.OpenAI(base_url=one.base_url, api_key=secret, max_retries=0)
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, n=12, max_tokens=40)  # type: ignore[arg-type]
    assert refused.value.code == "insufficient_quota" and refused.value.response.headers["x-should-retry"] == "false"
    assert "up to" in refused.value.message  # says the request is too large, not that the budget is spent
    answer = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)  # type: ignore[arg-type]
    assert answer.usage is not None and spent(one, name, 1) == answer.usage.total_tokens <= 50


def test_every_api_reserves_its_own_output_limit(sqlite_pair: tuple[RunningGateway, RunningGateway]) -> None:
    """Responses' max_output_tokens and Anthropic's max_tokens reserve like chat's: 400 tokens do not fit 50."""
    one, _ = sqlite_pair
    _, secret = create_key(one, budget_tokens=50, budget_period="day")
    client = openai.OpenAI(base_url=one.base_url, api_key=secret, max_retries=0)
    with pytest.raises(openai.RateLimitError) as refused:
        client.responses.create(model=MODEL, input="Write a short poem about the sea.", max_output_tokens=400)
    assert refused.value.code == "insufficient_quota"
    claude = anthropic.Anthropic(base_url=one.url, api_key=secret, max_retries=0)
    with pytest.raises(anthropic.RateLimitError):
        claude.messages.create(model=MODEL, max_tokens=400, messages=[{"role": "user", "content": "hello"}])
    answer = claude.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "hello"}])
    assert answer.usage.output_tokens <= 4  # a limit that fits is served
