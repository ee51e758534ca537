"""Admission reserves the prompt's estimate and max_tokens x n; the settle refunds what was not used,
and the stores clamp a refund at 0. Under concurrency on SQLite and a real Redis, shared by two
clients as two gateway processes share them, a budget is overspent by no more than the bound
gateway/tenancy/limits.py states: the estimate's error, per request in flight."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gateway.request_view import view_of
from gateway.tenancy.keys import KeyPolicy, new_record
from gateway.tenancy.limits import DEFAULT_OUTPUT_TOKENS, Limits, Reservation, reservation
from gateway.tenancy.service import Refused, Tenancy
from gateway.tenancy.store import KeyStore, Settlement, UsageDelta
from gateway.tenancy.ticket import Ticket
from tests.stores.key_stores import STORES, Clients

HELLO = {"messages": [{"role": "user", "content": "hello"}]}
PROMPT = view_of(HELLO).prompt_tokens


@pytest.mark.parametrize(("body", "context", "expected"), [
    ({**HELLO, "max_tokens": 16}, 2048, Reservation(PROMPT, 16)),
    ({**HELLO, "n": 12, "max_tokens": 40}, 2048, Reservation(PROMPT, 480)),
    ({**HELLO, "n": 2}, 2048, Reservation(PROMPT, 4096)),  # unset: the model's context per choice
    (HELLO, None, Reservation(PROMPT, DEFAULT_OUTPUT_TOKENS)),  # and no context known
    ({"prompt": ["a", "b"], "max_tokens": 5, "n": 3}, None, Reservation(4, 30)),
    ({"messages": []}, 100, Reservation(1, 100)),  # never less than one token
])
def test_reservation(body: dict[str, Any], context: int | None, expected: Reservation) -> None:
    assert reservation(view_of(body), context) == expected


def test_embeddings_reserve_no_output() -> None:
    assert reservation(view_of({"input": ["abcd", "abcd"]}, generates=False), 2048) == Reservation(4, 0)


@pytest.mark.parametrize(("prompt", "completion", "events", "delta"), [
    (31, 10, 0, 31 + 10 - 50),  # the engine counted less than reserved: a refund
    (40, 16, 0, 40 + 16 - 50),  # the prompt ran over its estimate, the output used all of max_tokens
    (None, None, 3, 34 + 3 - 50),  # a stream left without usage: the estimate and the events received
    (None, None, 0, 34 - 50),  # failed before the engine answered: the prompt's estimate only
])
def test_the_settle_is_used_minus_reserved(prompt: int | None, completion: int | None, events: int, delta: int) -> None:
    ticket = Ticket("k", "m", charged=50, estimate=34)
    ticket.record(prompt, completion)
    ticket.streamed_events = events
    assert ticket.token_delta() == delta
    assert ticket.prompt_used == (34 if prompt is None else prompt)


@pytest_asyncio.fixture(params=["sqlite", "redis"])
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[KeyStore, KeyStore]]:
    """Two store clients on the same data, as two gateway processes have."""
    made = Clients(STORES[request.param](request, tmp_path))
    yield made(), made()
    await made.close()


async def test_a_refund_is_clamped_at_zero(stores: tuple[KeyStore, KeyStore]) -> None:
    a, b = stores
    lim = Limits.of(KeyPolicy(tpm=1000, budget_tokens=1000), 1_796_165_000.0)
    usage = UsageDelta("c", "m", "2026-12-01", requests=1)
    assert (await a.reserve("c", lim, 100, "c1")).admitted
    await b.settle([Settlement("c1", "c", lim, -60, False, usage)])  # used 40 of the 100 reserved
    second = await a.reserve("c", lim, 10, "c2")
    assert (second.counters.budget_used, second.counters.tokens) == (50, 50)
    await b.settle([Settlement("c2", "c", lim, -500, False, usage)])  # more than was ever charged
    third = await a.reserve("c", lim, 10, "c3")
    assert (third.counters.budget_used, third.counters.tokens) == (10, 10)  # clamped at 0, never negative


@pytest.mark.parametrize("error", [0, 7])
async def test_a_budget_holds_its_bound_under_concurrency(stores: tuple[KeyStore, KeyStore], error: int) -> None:
    """30 requests at once of max_tokens 16 over two clients, a 300-token budget; the engine counts each
    prompt `error` tokens over the estimate and generates up to max_tokens."""
    budget, max_tokens, n = 300, 16, 30
    record, _ = new_record("b", KeyPolicy(budget_tokens=budget, budget_period="day"))
    await stores[0].create(record)  # a stored key: each reserve checks it is still active
    gateways = [Tenancy(store) for store in stores]
    charge = reservation(view_of({**HELLO, "max_tokens": max_tokens}), 2048)
    in_flight = peak = 0
    rng = random.Random(3)

    async def one(i: int) -> bool:
        nonlocal in_flight, peak
        tenancy = gateways[i % 2]
        try:
            ticket = await tenancy.reserve(record, "m", charge)
        except Refused:
            return False
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(rng.random() / 50)
        ticket.record(charge.prompt + error, rng.randint(1, max_tokens))
        in_flight -= 1
        await tenancy.settle(ticket, failed=False, engine_s=0.0)
        return True

    served = 0
    for _ in range(3):  # waves, until the budget refuses everything
        served += sum(await asyncio.gather(*(one(i) for i in range(n))))
    rows = await stores[0].usage("b")
    spent = sum(r["prompt_tokens"] + r["completion_tokens"] for r in rows)
    bound = peak * error
    print(f"\nerror {error}: {served} served, spent {spent} of {budget} (bound {bound}, peak in flight {peak})")
    assert served >= budget // (charge.tokens + error)  # refunds let later requests in
    assert spent <= budget + bound
