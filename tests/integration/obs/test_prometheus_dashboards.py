"""A real Prometheus (Debian's package) scrapes a live gateway serving the embedded model; after
traffic, every PromQL expression in the Grafana dashboards and in the alert rules must return data
through Prometheus's HTTP API. The GPU figures come from the NVML emulator in fake_nvml/ (no GPU here)."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from tests.gateway_process import REPO_ROOT as REPO
from tests.gateway_process import RunningGateway as Gateway
from tests.integration.obs.conftest import METRICS_KEY
from tests.integration.obs.support import free_port, send_traffic, stop

PROMETHEUS = shutil.which("prometheus")
DEPLOY = REPO / "deploy"
DASHBOARDS = sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))
# Grafana's variables as a dashboard with "All" selected sends them; a window wide enough to hold the test's traffic.
SUBSTITUTIONS = {"$__rate_interval": "5m", "$__interval": "5s", "$model": ".*", "$engine": ".*"}
GUARD_S = 180.0  # hang guard for waits on Prometheus, not a performance assertion
COMPARISON = re.compile(r"^(?P<lhs>.+?)\s*(==|!=|>=|<=|>|<)\s*[0-9.eE+-]+$", re.S)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(PROMETHEUS is None, reason="Debian's prometheus is not installed (.ci/run installs it)"),
]


def substitute(expr: str) -> str:
    for name, value in SUBSTITUTIONS.items():
        expr = expr.replace("${" + name[1:] + "}", value).replace(name, value)
    return expr


def dashboard_exprs() -> list[tuple[str, str]]:
    found = []
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                found.append((f"{path.name}: {panel['title']} [{target['refId']}]", target["expr"]))
    return found


def dashboard_variables() -> list[tuple[str, str, str]]:
    out = []
    for path in DASHBOARDS:
        for var in json.loads(path.read_text())["templating"]["list"]:
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var["query"]["query"])
            assert m, f"{path.name}: variable {var['name']} is not label_values(metric, label)"
            out.append((f"{path.name}: ${var['name']}", m.group(1), m.group(2)))
    return out


def rules() -> list[dict[str, Any]]:
    out = []
    for path in (DEPLOY / "prometheus" / "rules").glob("*.yml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            out.extend(group["rules"])
    return out


def alert_inputs(expr: str) -> list[str]:
    """The measured side of each comparison in an alert expression (alerts compare a series with a number)."""
    parts = re.split(r"\s+(?:or|and|unless)\s+", expr.strip())
    inputs = []
    for part in parts:
        m = COMPARISON.match(part.strip())
        assert m, f"alert expression part {part!r} is not `<series> <op> <number>`"
        inputs.append(m.group("lhs"))
    return inputs


class Prom:
    def __init__(self, url: str) -> None:
        self.client = httpx.Client(base_url=url, timeout=30)

    def query(self, expr: str) -> list[dict[str, Any]]:
        r = self.client.get("/api/v1/query", params={"query": expr})
        body = r.json()
        assert r.status_code == 200 and body["status"] == "success", f"{expr}: {body}"
        return body["data"]["result"]  # type: ignore[no-any-return]

    def wait_for(self, what: str, condition: Any) -> None:
        deadline = time.monotonic() + GUARD_S
        while time.monotonic() < deadline:
            if condition():
                return
            time.sleep(0.5)
        raise AssertionError(f"Prometheus never showed: {what}")


def total(result: list[dict[str, Any]]) -> float:
    return sum(float(s["value"][1]) for s in result)


def has_data(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(s["value"][1])) for s in result)


@pytest.fixture(scope="module")
def prometheus(gateway_with_fake_gpu: Gateway, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prom]:
    tmp = tmp_path_factory.mktemp("prometheus")
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(DEPLOY / "prometheus" / f) for f in config["rule_files"]]
    jobs = [job for job in config["scrape_configs"] if job["job_name"] == "enginegate"]
    assert jobs, "deploy/prometheus/prometheus.yml has no enginegate job"
    jobs[0]["static_configs"] = [{"targets": [f"127.0.0.1:{gateway_with_fake_gpu.port}"]}]
    jobs[0]["authorization"] = {"credentials": METRICS_KEY}
    config["scrape_configs"] = jobs
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (tmp / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    prom = Prom(f"http://127.0.0.1:{port}")

    def target_up() -> bool:
        assert process.poll() is None, (tmp / "prometheus.log").read_text()
        try:
            targets = prom.client.get("/api/v1/targets").json()["data"]["activeTargets"]
        except (httpx.TransportError, ValueError, KeyError):
            return False
        return bool(targets) and targets[0]["health"] == "up"

    try:
        prom.wait_for("the gateway target up (scraped with the metrics key)", target_up)
        yield prom
    finally:
        stop(process)
        log.close()


@pytest.fixture(scope="module")
def after_traffic(prometheus: Prom, gateway_with_fake_gpu: Gateway) -> Prom:
    send_traffic(gateway_with_fake_gpu.url)
    stats = httpx.get(f"{gateway_with_fake_gpu.url}/v1/gateway/stats").json()["models"]
    completion = sum(m["completion_tokens"] for m in stats.values())
    assert completion > 0
    prometheus.wait_for(
        "the traffic's completion tokens and the disconnect scraped",
        lambda: total(prometheus.query("sum(enginegate_completion_tokens_total)")) == completion
        and total(prometheus.query("sum(enginegate_client_disconnects_total)")) >= 1,
    )
    prometheus.wait_for("recording rules evaluated after the traffic",
                        lambda: has_data(prometheus.query("enginegate:ttft_seconds:p95_5m")))
    return prometheus


def test_metrics_need_the_key(gateway_with_fake_gpu: Gateway) -> None:
    assert httpx.get(f"{gateway_with_fake_gpu.url}/metrics").status_code == 401


def test_every_dashboard_query_returns_data(after_traffic: Prom) -> None:
    exprs = dashboard_exprs()
    assert len(exprs) >= 30 and len(DASHBOARDS) == 3
    empty = [f"{where}: {expr}" for where, expr in exprs if not has_data(after_traffic.query(substitute(expr)))]
    assert not empty, "dashboard queries without data:\n" + "\n".join(empty)


def test_every_dashboard_variable_has_values(after_traffic: Prom) -> None:
    for where, metric, label in dashboard_variables():
        result = after_traffic.query(f"group by ({label}) ({substitute(metric)})")
        assert [s["metric"].get(label) for s in result if s["metric"].get(label)], where


def test_every_rule_input_returns_data_and_nothing_fires(after_traffic: Prom) -> None:
    all_rules = rules()
    records = [r for r in all_rules if "record" in r]
    alerts = [r for r in all_rules if "alert" in r]
    assert {a["alert"] for a in alerts} >= {"EnginegateNoReadyModel", "EnginegateHighErrorRate", "EnginegateSlowFirstToken", "EnginegateQueueFull"}
    empty = [r["record"] for r in records if not has_data(after_traffic.query(r["record"]))]
    for alert in alerts:
        after_traffic.query(alert["expr"])  # valid PromQL
        empty += [f"{alert['alert']}: {lhs}" for lhs in alert_inputs(alert["expr"]) if not has_data(after_traffic.query(lhs))]
    assert not empty, "rule inputs without data:\n" + "\n".join(empty)
    active = after_traffic.client.get("/api/v1/alerts").json()["data"]["alerts"]
    assert not active, f"a healthy gateway raised alerts: {active}"


def test_engine_and_gateway_agree(after_traffic: Prom) -> None:
    # Tokens the gateway delivered never exceed those the engine reports generating.
    delivered = total(after_traffic.query("sum(enginegate_completion_tokens_total)"))
    generated = total(after_traffic.query("sum(enginegate_engine_generation_tokens)"))
    assert 0 < delivered <= generated
    info = after_traffic.query("enginegate_model_info")
    assert info and info[0]["metric"]["engine"] == "llamacpp"
