"""The recent-requests record against a real `enginegate serve` relaying to the engine emulator:
the live stream gets each row as it finishes and ends cleanly when the gateway drains (SIGTERM);
a client that leaves mid-stream is recorded as 499 (its work cancelled), a relayed answer with the
engine's finish reason and tokens; each key sees its own tenant's rows only."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.emulators.fixture import RunningEmulator, running_emulator
from tests.gateway_process import RunningGateway, gateway

pytestmark = pytest.mark.integration
ADMIN, USER = "recent-admin-secret-51", "recent-user-secret-62"
GUARD_S = 60.0  # hang guard, not a performance assertion


@pytest.fixture(scope="module")
def upstream() -> Iterator[RunningEmulator]:
    with running_emulator("vllm", "--tokens", "40", "--itl-ms", "50") as emu:
        yield emu


def config(url: str) -> str:
    return (f"api_keys:\n  - {{key: {ADMIN}, role: admin, name: ops}}\n  - {{key: {USER}, name: alice}}\n"
            "shutdown_grace_seconds: 300\n"
            "models:\n  - source: remote\n    name: relayed\n    engine: openai\n"
            f"    options: {{base_url: \"{url}\", upstream_model: emulated-model}}\n")


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def chat(gw: RunningGateway, key: str, **extra: object) -> httpx.Response:
    body = {"model": "relayed", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 3, **extra}
    return httpx.post(gw.url + "/v1/chat/completions", json=body, headers=auth(key), timeout=GUARD_S)


def test_live_rows_then_a_clean_end_when_the_gateway_drains(upstream: RunningEmulator) -> None:
    with gateway(config_yaml=config(upstream.url)) as gw:
        events: list[str] = []
        ended = threading.Event()

        def follow() -> None:
            with httpx.stream("GET", gw.url + "/admin/requests/stream", headers=auth(ADMIN), timeout=GUARD_S) as r:
                assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
                for line in r.iter_lines():
                    events.append(line)
            ended.set()

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        deadline = time.monotonic() + GUARD_S
        while not events and time.monotonic() < deadline:  # the stream's opening comment: subscribed
            time.sleep(0.02)
        answer = chat(gw, USER)
        assert answer.status_code == 200
        rid = answer.headers["x-enginegate-request-id"]
        while not any(rid in e for e in events) and time.monotonic() < deadline:
            time.sleep(0.02)
        row = json.loads(next(e for e in events if rid in e).removeprefix("data: "))
        assert (row["tenant"], row["model"], row["engine"], row["replica"]) == ("alice", "relayed", "openai", "0")
        assert row["finish_reason"] == "length" and row["completion_tokens"] == 3 and row["stream"] is False
        assert answer.headers["x-enginegate-engine"] == "openai"
        gw.process.send_signal(signal.SIGTERM)
        assert ended.wait(GUARD_S), "the live stream did not end when the gateway drained"
        assert 'data: {"reason": "shutdown"}' in events
        gw.process.wait(GUARD_S)  # nothing held the drain for its 300 s grace: it exited long before
        assert "Traceback" not in gw.log()


def test_a_client_gone_mid_stream_is_499_and_keys_see_their_own_rows(upstream: RunningEmulator) -> None:
    with gateway(config_yaml=config(upstream.url)) as gw:
        body = {"model": "relayed", "messages": [{"role": "user", "content": "a long answer"}], "stream": True}
        with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, headers=auth(USER), timeout=GUARD_S) as r:
            rid = r.headers["x-enginegate-request-id"]
            assert r.headers["x-enginegate-replica"] == "0"
            next(r.iter_bytes())  # the first event, then the client leaves
        deadline = time.monotonic() + GUARD_S
        rows: list[dict[str, object]] = []
        while not rows and time.monotonic() < deadline:
            rows = httpx.get(gw.url + "/admin/requests", params={"id": rid}, headers=auth(USER), timeout=10).json()["data"]
            time.sleep(0.05)
        assert rows[0]["status"] == 499 and rows[0]["stream"] is True and rows[0]["tenant"] == "alice"
        assert chat(gw, ADMIN).status_code == 200
        mine = httpx.get(gw.url + "/admin/requests", headers=auth(USER), timeout=10).json()["data"]
        everyone = httpx.get(gw.url + "/admin/requests", headers=auth(ADMIN), timeout=10).json()["data"]
        assert {r["tenant"] for r in mine} == {"alice"} and {r["tenant"] for r in everyone} == {"alice", "ops"}
        assert httpx.get(gw.url + "/admin/limits", headers=auth(USER), timeout=10).status_code == 403
