"""A real gateway says at start-up (its log and its summary) what its configuration exposes (issue 32,
item 7): no keys on a non-loopback address opens the admin routes to the network; tenancy.key_metrics
with an open /metrics lists every tenant. It still starts: the operator's setting wins."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.gateway_process import gateway

pytestmark = pytest.mark.integration
LAZY = "models: [{name: m, preload: false}]\n"
NO_KEYS = "no API keys and listening on 0.0.0.0"
KEY_METRICS = "tenancy.key_metrics is on and /metrics needs no key"


@pytest.mark.parametrize(("args", "config", "says"), [
    (["--host", "0.0.0.0"], LAZY, [NO_KEYS]),
    (["--host", "0.0.0.0"], "api_keys: [{key: k-admin, role: admin}]\n" + LAZY, []),
    ([], LAZY, []),  # 127.0.0.1, no keys: only this machine
    ([], "tenancy: {key_metrics: true}\napi_keys: [{key: k-team, name: team-a}]\n" + LAZY, [KEY_METRICS]),
    ([], "tenancy: {key_metrics: true}\nmetrics_api_key: m\napi_keys: [{key: k-team, name: team-a}]\n" + LAZY, []),
])
def test_start_up_warns_of_what_is_exposed(tmp_path: Path, args: list[str], config: str, says: list[str]) -> None:
    with gateway(args, config_yaml=config, env={"XDG_DATA_HOME": str(tmp_path)}) as gw:
        assert httpx.get(gw.url + "/health", timeout=10).status_code == 200  # warned, and serving
        log = gw.log()
    for warning in (NO_KEYS, KEY_METRICS):
        logged = [line for line in log.splitlines() if warning in line]
        if warning in says:  # once in the log (WARNING enginegate: ...), once in the summary
            assert len(logged) == 2 and any("WARNING enginegate:" in line for line in logged), log
            assert any(line.startswith("  WARNING: ") for line in logged), log
        else:
            assert not logged, log
