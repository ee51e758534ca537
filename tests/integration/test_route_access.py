"""Every route of the published OpenAPI schema, tried with no key, a user key and an admin key
against a real `enginegate serve`: the answer is the one the access table (gateway/tenancy/access.py,
the one place the code decides) and the schema document. Then: `enginegate keys create` and
`serve` find the same keys with no configuration, and a restarted gateway keeps its usage."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.tenancy.access import required_access
from tests.emulators.fixture import RunningEmulator, running_emulator
from tests.gateway_process import REPO_ROOT, RunningGateway, gateway

pytestmark = pytest.mark.integration
USER, ADMIN = "user-secret-91d2", "admin-secret-4c7e"
CREDENTIALS: dict[str, dict[str, str]] = {
    "none": {}, "user": {"Authorization": f"Bearer {USER}"}, "admin": {"Authorization": f"Bearer {ADMIN}"}}
MODEL_CONFIG = ("models:\n  - source: remote\n    name: relayed\n    engine: openai\n"
                "    options: {{base_url: \"{url}\", upstream_model: emulated-model}}\n")


@pytest.fixture(scope="module")
def upstream() -> Iterator[RunningEmulator]:
    with running_emulator("vllm", "--tokens", "3") as emu:
        yield emu


@pytest.fixture(scope="module")
def gw(upstream: RunningEmulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    config = (f"api_keys:\n  - {USER}\n  - {{key: {ADMIN}, role: admin}}\n" + MODEL_CONFIG.format(url=upstream.url))
    with gateway(config_yaml=config, env={"XDG_DATA_HOME": str(tmp_path_factory.mktemp("data"))}) as running:
        yield running


def expected(path: str, who: str, documented: set[str]) -> set[int] | None:
    """401 or 403 where the role is missing; None: the route's own answer (one the schema documents)."""
    access = required_access(path)
    if who == "none" and access in ("user", "admin"):
        return {401}
    if who == "user" and access == "admin":
        return {403}
    return None


def test_every_published_route_answers_as_the_access_table_says(gw: RunningGateway) -> None:
    spec = httpx.get(gw.url + "/openapi.json", timeout=10).json()
    tried = 0
    with httpx.Client(base_url=gw.url, timeout=60) as client:
        for path, operations in spec["paths"].items():
            url = path.replace("{model}", "no-such-model").replace("{model_id}", "no-such-model").replace(
                "{response_id}", "resp_none").replace("{name}", "no-such-key")
            assert "{" not in url, f"fill the path parameter of {path}"
            for method, operation in operations.items():
                documented = set(operation["responses"])
                for who, headers in CREDENTIALS.items():
                    r = client.request(method.upper(), url, headers=headers, **({"json": {}} if method == "post" else {}))
                    want = expected(path, who, documented)
                    if want is not None:
                        assert r.status_code in want, f"{who} {method.upper()} {path}: {r.status_code} {r.text[:200]}"
                    else:
                        assert r.status_code not in (401, 403), f"{who} {method.upper()} {path}: {r.status_code}"
                        assert str(r.status_code) in documented, f"{who} {method.upper()} {path}: {r.status_code} undocumented"
                    if r.status_code in (401, 403):
                        assert str(r.status_code) in documented, f"{method.upper()} {path} does not document {r.status_code}"
                        assert r.status_code == 401 or r.json()["error"]["code"] == "permission_denied"
                    tried += 1
    assert tried >= 3 * 20
    assert {p for p in spec["paths"] if required_access(p) == "admin"} >= {"/admin/keys", "/admin/usage", "/admin/engines",
                                                                             "/v1/gateway/plan"}


def test_only_an_admin_key_sees_engine_urls_in_ready(gw: RunningGateway, upstream: RunningEmulator) -> None:
    port = str(upstream.port)
    shown = {who: httpx.get(gw.url + "/ready", headers=h, timeout=10).json()["models"]["relayed"]["detail"]
             for who, h in CREDENTIALS.items()}
    assert port in shown["admin"]
    assert port not in shown["user"] and shown["user"] == shown["none"]


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args], capture_output=True, text=True, timeout=60,
                          cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **env}, check=False)


def test_keys_made_by_the_cli_are_the_ones_serve_reads_and_usage_survives_a_restart(
        upstream: RunningEmulator, tmp_path: Path) -> None:
    env = {"XDG_DATA_HOME": str(tmp_path)}
    made = run_cli("keys", "create", "team-a", "--rpm", "100", "--json", env=env)
    assert made.returncode == 0, made.stderr
    secret = json.loads(made.stdout)["key"]
    auth = {"Authorization": f"Bearer {secret}"}
    body: dict[str, Any] = {"model": "relayed", "messages": [{"role": "user", "content": "hi"}]}
    for round_ in range(2):  # the second gateway is the first one restarted
        with gateway(config_yaml=MODEL_CONFIG.format(url=upstream.url), env=env) as running:
            assert httpx.post(running.url + "/v1/chat/completions", json=body, timeout=30).status_code == 401
            for _ in range(3):
                assert httpx.post(running.url + "/v1/chat/completions", json=body, headers=auth, timeout=30).status_code == 200
            stream = httpx.post(running.url + "/v1/chat/completions", json={**body, "stream": True}, headers=auth, timeout=30)
            assert stream.status_code == 200 and "[DONE]" in stream.text
        shown = run_cli("usage", "--key", "team-a", "--json", env=env)
        rows = json.loads(shown.stdout)
        assert [(r["requests"], r["completion_tokens"]) for r in rows] == [(4 * (round_ + 1), 12 * (round_ + 1))]
        assert secret not in running.log() and secret not in shown.stdout
    listed = run_cli("keys", "list", env=env)
    assert "team-a" in listed.stdout and "rpm=100" in listed.stdout and secret not in listed.stdout
    assert oct((tmp_path / "enginegate" / "keys.sqlite3").stat().st_mode & 0o777) == "0o600"


def test_sigterm_with_a_stream_in_flight_loses_no_usage(tmp_path: Path) -> None:
    env = {"XDG_DATA_HOME": str(tmp_path)}
    made = run_cli("keys", "create", "draining", "--tpm", "1000000", "--json", env=env)
    secret = json.loads(made.stdout)["key"]
    body = {"model": "relayed", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 3000}
    with running_emulator("vllm", "--tokens", "3000", "--itl-ms", "10") as slow, \
            gateway(config_yaml="shutdown_grace_seconds: 1\n" + MODEL_CONFIG.format(url=slow.url), env=env) as running:
        received = 0
        with httpx.stream("POST", running.url + "/v1/chat/completions", json=body, timeout=60,
                          headers={"Authorization": f"Bearer {secret}"}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                received += line.startswith("data: {") and '"content"' in line
                if received == 20:
                    os.kill(running.process.pid, signal.SIGTERM)  # the drain ends this stream after 1 s
        assert running.process.wait(timeout=60) in (0, -signal.SIGTERM)
        assert "Traceback" not in running.log()
    rows = json.loads(run_cli("usage", "--key", "draining", "--json", env=env).stdout)
    assert len(rows) == 1 and rows[0]["requests"] == 1
    assert 20 <= rows[0]["completion_tokens"] <= received + 1, (rows, received)
