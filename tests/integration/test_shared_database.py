"""Several gateways, one service (issue 33): `enginegate serve` processes with separate data directories
and one `database_url` (a real Debian PostgreSQL), in front of the engine emulator. A stored Response
made through one gateway is read and continued through another by the official `openai` client and by
openai-agents; other tenants cannot tell it exists, an admin can; the database stopped answers 503 with
Retry-After in bounded time and the gateways recover by themselves; a gateway killed mid-conversation
loses nothing; gateways starting together on an empty database all come up."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import openai
import pytest

from tests.emulators.fixture import RunningEmulator, running_emulator
from tests.gateway_process import RunningGateway, gateway
from tests.postgres_server import PostgresServer, postgres_server

pytestmark = pytest.mark.integration
MODEL = "relayed"
TOKENS = 4
STORE_TIMEOUT_S = 1.0
ADMIN, TEAM_A, TEAM_B = "admin-5e1f0c7a9b", "team-a-3d8e2b6f41", "team-b-9c4a7e1d02"
DB_PASSWORD = "db-pw-4b7e0d19c2"


@pytest.fixture(scope="module")
def upstream() -> Iterator[RunningEmulator]:
    with running_emulator("vllm", "--tokens", str(TOKENS)) as emu:
        yield emu


@pytest.fixture(scope="module")
def slow_upstream() -> Iterator[RunningEmulator]:
    with running_emulator("vllm", "--tokens", "200", "--itl-ms", "20") as emu:
        yield emu


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    """This module's own server: its fault tests stop and start it."""
    with postgres_server() as server:
        yield server


def config(upstream: RunningEmulator, database_url: str, slow: RunningEmulator | None = None) -> str:
    slow_model = ("  - source: remote\n    name: slow\n    engine: openai\n"
                  f"    options: {{base_url: \"{slow.url}\", upstream_model: emulated-model}}\n") if slow else ""
    return (f"api_keys:\n  - {{key: {ADMIN}, role: admin, name: ops}}\n"
            f"  - {{key: {TEAM_A}, name: team-a}}\n  - {{key: {TEAM_B}, name: team-b}}\n"
            f"database_url: \"{database_url}\"\n"
            f"tenancy: {{store_timeout_seconds: {STORE_TIMEOUT_S}}}\n"
            "models:\n  - source: remote\n    name: relayed\n    engine: openai\n    max_queue: 64\n"
            f"    options: {{base_url: \"{upstream.url}\", upstream_model: emulated-model}}\n" + slow_model)


@contextmanager
def gateways(upstream: RunningEmulator, database_url: str, n: int = 2,
             slow: RunningEmulator | None = None) -> Iterator[list[RunningGateway]]:
    """n gateways, each with its own data directory (XDG_DATA_HOME), started at the same time."""
    yaml = config(upstream, database_url, slow)
    with ExitStack() as stack:
        homes = [Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="enginegate-home-"))) for _ in range(n)]
        with ThreadPoolExecutor(n) as pool:
            started = list(pool.map(lambda home: stack.enter_context(
                gateway(config_yaml=yaml, env={"XDG_DATA_HOME": str(home)})), homes))
        for home in homes:  # the stored responses are in the database, not in a data directory
            assert not (home / "enginegate" / "responses.sqlite3").exists()
        yield started
        for home in homes:
            assert not (home / "enginegate" / "responses.sqlite3").exists()


@pytest.fixture(scope="module")
def pair(upstream: RunningEmulator, pg: PostgresServer) -> Iterator[list[RunningGateway]]:
    url = pg.createdb().replace("eg@", f"eg:{DB_PASSWORD}@")  # trust authentication ignores it; no log may show it
    with gateways(upstream, url) as started:
        yield started
        for gw in started:
            assert DB_PASSWORD not in gw.log()


def client(gw: RunningGateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0, timeout=30)


def test_a_response_stored_through_one_gateway_is_read_and_continued_through_the_other(pair: list[RunningGateway]) -> None:
    one, two = pair
    assert "stored responses in postgresql://eg@127.0.0.1:" in one.log()  # the summary names it, without the password
    first = client(one, TEAM_A).responses.create(model=MODEL, input="alpha beta gamma", max_output_tokens=TOKENS)
    assert first.store is True and first.usage is not None
    a_two = client(two, TEAM_A)
    assert a_two.responses.retrieve(first.id).output_text == first.output_text
    items = a_two.responses.input_items.list(first.id)
    assert [item.type for item in items.data] == ["message"]
    second = a_two.responses.create(model=MODEL, input="delta", previous_response_id=first.id, max_output_tokens=TOKENS)
    assert second.previous_response_id == first.id and second.usage is not None
    # the other gateway sent the whole conversation: the first turn's input and output, then the new input
    alone = a_two.responses.create(model=MODEL, input="delta", max_output_tokens=TOKENS, store=False)
    assert alone.usage is not None
    assert second.usage.input_tokens == alone.usage.input_tokens + first.usage.input_tokens + first.usage.output_tokens
    assert client(one, TEAM_A).responses.retrieve(second.id).previous_response_id == first.id


def test_another_tenant_cannot_tell_it_exists_on_either_gateway_and_an_admin_can(pair: list[RunningGateway]) -> None:
    one, two = pair
    first = client(one, TEAM_A).responses.create(model=MODEL, input="private words", max_output_tokens=TOKENS)
    missing = "resp_" + "0" * 32
    for gw in pair:
        b = client(gw, TEAM_B)
        for response_id in (first.id, missing):  # the same answer as for an id that never existed
            with pytest.raises(openai.NotFoundError) as caught:
                b.responses.retrieve(response_id)
            assert caught.value.body["code"] == "not_found"  # type: ignore[index]
            with pytest.raises(openai.NotFoundError):
                b.responses.input_items.list(response_id)
            with pytest.raises(openai.BadRequestError) as refused:
                b.responses.create(model=MODEL, input="and?", previous_response_id=response_id, max_output_tokens=TOKENS)
            assert refused.value.body["code"] == "previous_response_not_found"  # type: ignore[index]
            with pytest.raises(openai.NotFoundError):
                b.responses.delete(response_id)
        assert client(gw, ADMIN).responses.retrieve(first.id).id == first.id
    assert client(two, TEAM_A).responses.retrieve(first.id).id == first.id  # team-b's delete did nothing
    # an id no record can have (PostgreSQL text holds no NUL) is a missing id, not a 503
    nul = httpx.get(one.url + "/v1/responses/resp_%00x", headers={"Authorization": f"Bearer {TEAM_A}"}, timeout=10)
    assert nul.status_code == 404 and nul.json()["error"]["code"] == "not_found"
    client(two, TEAM_A).responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client(one, ADMIN).responses.retrieve(first.id)


def test_an_openai_agents_conversation_alternates_between_the_gateways(pair: list[RunningGateway]) -> None:
    agents = pytest.importorskip("agents", reason="openai-agents is not installed (pip install openai-agents)")
    agents.set_tracing_disabled(True)

    async def conversation() -> list[str]:
        ids: list[str] = []
        previous: str | None = None
        for turn in range(4):
            gw = pair[turn % 2]
            model = agents.OpenAIResponsesModel(
                model=MODEL, openai_client=openai.AsyncOpenAI(base_url=gw.base_url, api_key=TEAM_A, max_retries=0))
            agent = agents.Agent(name="helper", instructions="Answer briefly.", model=model,
                                 model_settings=agents.ModelSettings(store=True))
            result = await agents.Runner.run(agent, f"turn {turn}", previous_response_id=previous)
            assert result.final_output
            previous = result.last_response_id
            assert previous is not None
            ids.append(previous)
        return ids

    ids = asyncio.run(conversation())
    a = client(pair[0], TEAM_A)
    for turn, response_id in enumerate(ids):  # each turn chained to the one before, whichever gateway served it
        stored = a.responses.retrieve(response_id)
        assert stored.previous_response_id == (ids[turn - 1] if turn else None)
    # the last turn's history holds every turn's input, in order: nothing was lost crossing gateways
    last = client(pair[1], TEAM_A).responses.create(model=MODEL, input="done", previous_response_id=ids[-1],
                                                    max_output_tokens=TOKENS)
    assert last.usage is not None and last.usage.input_tokens > 4 * TOKENS


def test_a_gateway_killed_mid_conversation_loses_nothing(upstream: RunningEmulator, slow_upstream: RunningEmulator,
                                                         pg: PostgresServer) -> None:
    with gateways(upstream, pg.createdb(), slow=slow_upstream) as (one, two):
        a_one, a_two = client(one, TEAM_A), client(two, TEAM_A)
        previous = a_one.responses.create(model=MODEL, input="first", max_output_tokens=TOKENS).id
        previous = a_two.responses.create(model=MODEL, input="second", previous_response_id=previous,
                                          max_output_tokens=TOKENS).id
        previous = a_one.responses.create(model=MODEL, input="third", previous_response_id=previous,
                                          max_output_tokens=TOKENS).id
        # the fourth turn is streaming from gateway one when it is killed: no shutdown, no flush
        stream = a_one.responses.create(model="slow", input="fourth", previous_response_id=previous, stream=True)
        events = iter(stream)
        assert next(events).type == "response.created"
        os.killpg(one.process.pid, signal.SIGKILL)
        one.process.wait()
        with pytest.raises(openai.APIError):  # the connection broke mid-stream
            for _ in events:
                pass
        # the client retries the turn on the other gateway, from the last turn that completed
        turn = a_two.responses.create(model=MODEL, input="fourth", previous_response_id=previous, max_output_tokens=TOKENS)
        assert turn.previous_response_id == previous
        history = a_two.responses.input_items.list(turn.id)
        assert [item.type for item in history.data] == ["message"]
        assert a_two.responses.retrieve(previous).id == previous


def test_database_stopped_answers_503_in_bounded_time_and_recovers_without_a_restart(
        pair: list[RunningGateway], pg: PostgresServer) -> None:
    one, two = pair
    stored = client(one, TEAM_A).responses.create(model=MODEL, input="before the outage", max_output_tokens=TOKENS)
    pg.stop()
    try:
        headers = {"Authorization": f"Bearer {TEAM_A}"}
        for gw in pair:
            for method, path, body in (
                    ("GET", f"/v1/responses/{stored.id}", None),
                    ("GET", f"/v1/responses/{stored.id}/input_items", None),
                    ("DELETE", f"/v1/responses/{stored.id}", None),
                    ("POST", "/v1/responses", {"model": MODEL, "input": "next", "previous_response_id": stored.id,
                                               "max_output_tokens": TOKENS})):
                began = time.monotonic()
                r = httpx.request(method, gw.url + path, json=body, headers=headers, timeout=30)
                took = time.monotonic() - began
                assert r.status_code == 503, r.text
                assert took < STORE_TIMEOUT_S + 1, f"{method} {path} took {took:.2f} s"
                assert r.headers["retry-after"] == "1"
                error = r.json()["error"]
                assert error["code"] == "store_unavailable" and "retry later" in error["message"]
                assert "127.0.0.1" not in error["message"] and "eg@" not in error["message"]
            # what does not need the database keeps working
            chat = httpx.post(gw.url + "/v1/chat/completions", headers=headers, timeout=30,
                              json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": TOKENS})
            assert chat.status_code == 200, chat.text
            unstored = client(gw, TEAM_A).responses.create(model=MODEL, input="x", store=False, max_output_tokens=TOKENS)
            assert unstored.output_text
            assert httpx.get(gw.url + "/health", timeout=10).status_code == 200
        # a store: true answer while the database is down is still an answer, marked as not stored
        began = time.monotonic()
        answered = client(two, TEAM_A).responses.create(model=MODEL, input="during", max_output_tokens=TOKENS)
        assert answered.output_text and answered.store is False
        assert time.monotonic() - began < STORE_TIMEOUT_S + 1
    finally:
        pg.start()
    for gw in pair:  # the next request succeeds, no gateway restarted
        after = client(gw, TEAM_A).responses.create(model=MODEL, input="after", previous_response_id=stored.id,
                                                    max_output_tokens=TOKENS)
        assert after.previous_response_id == stored.id and after.store is True
    assert all(gw.process.poll() is None for gw in pair)


def test_a_database_that_never_answers_is_503_at_the_timeout_not_a_hang(upstream: RunningEmulator) -> None:
    """A network partition: the address accepts connections (a listening socket nobody serves) and no
    byte ever comes back. Start-up waits the timeout once and goes on; every request that needs the
    database answers 503 in bounded time."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(64)
        with gateways(upstream, f"postgresql://eg@127.0.0.1:{hole.getsockname()[1]}/enginegate", n=1) as (gw,):
            headers = {"Authorization": f"Bearer {TEAM_A}"}
            for _ in range(3):
                began = time.monotonic()
                r = httpx.get(gw.url + "/v1/responses/resp_" + "2" * 32, headers=headers, timeout=30)
                took = time.monotonic() - began
                assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
                assert took < STORE_TIMEOUT_S + 1, f"took {took:.2f} s"
            chat = httpx.post(gw.url + "/v1/chat/completions", headers=headers, timeout=30,
                              json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": TOKENS})
            assert chat.status_code == 200, chat.text


def test_a_gateway_started_before_its_database_serves_then_recovers(upstream: RunningEmulator, pg: PostgresServer) -> None:
    url = pg.createdb()
    pg.stop()
    try:
        with gateways(upstream, url, n=1) as (gw,):
            assert "unreachable at start-up; starting anyway" in gw.log()
            with pytest.raises(openai.InternalServerError) as caught:
                client(gw, TEAM_A).responses.retrieve("resp_" + "1" * 32)
            assert caught.value.status_code == 503
            pg.start()
            first = client(gw, TEAM_A).responses.create(model=MODEL, input="now", max_output_tokens=TOKENS)
            assert client(gw, TEAM_A).responses.retrieve(first.id).id == first.id  # migrated on first use
    finally:
        pg.start()


def test_gateways_starting_together_on_an_empty_database_all_come_up(upstream: RunningEmulator, pg: PostgresServer) -> None:
    url = pg.createdb()
    with gateways(upstream, url, n=3) as started:
        first = client(started[0], TEAM_A).responses.create(model=MODEL, input="hello", max_output_tokens=TOKENS)
        for gw in started:
            assert client(gw, TEAM_A).responses.retrieve(first.id).id == first.id
    database = url.rsplit("/", 1)[1]
    assert pg.psql(database, "SELECT component, version FROM schema_versions").split() == ["responses|4"]


def test_a_database_that_refuses_the_login_fails_start_up_in_one_line(upstream: RunningEmulator, pg: PostgresServer) -> None:
    with pytest.raises(RuntimeError) as caught, gateways(upstream, pg.url("no_such_database", password="pw-never-shown"), n=1):
        pass
    log = str(caught.value)
    assert "enginegate: cannot start: cannot use the response store" in log and "no_such_database" in log
    assert "pw-never-shown" not in log and "Traceback" not in log
