"""Metrics to traces, with real processes: a gateway traced into a real OTLP receiver (Phoenix), a real
Prometheus (Debian's) scraping it with exemplar storage on, as deploy/docker-compose.yml runs it. After a
streamed chat that carries a caller's traceparent, Prometheus answers /api/v1/query_exemplars for the
latency histograms with that request's trace id, and the receiver holds that trace: the link a Grafana
panel follows from a slow bucket leads to the request's spans."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import yaml

from tests.gateway_process import RunningGateway
from tests.integration.obs.support import free_port, stop
from tests.integration.obs.test_prometheus_dashboards import (
    DEPLOY,
    GUARD_S,
    PROMETHEUS,
    Prom,
)
from tests.integration.obs.traced import SPANS_GUARD_S, traceparent
from tests.otlp_receiver import Receiver

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(PROMETHEUS is None, reason="Debian's prometheus is not installed (.ci/run installs it)"),
]
LATENCY = ("enginegate_time_to_first_token_seconds", "enginegate_inter_token_latency_seconds",
           "enginegate_queue_wait_seconds", "enginegate_request_duration_seconds")


def compose_prometheus_features() -> list[str]:
    """The feature flags deploy/docker-compose.yml gives Prometheus: the test runs what users run."""
    command = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]["prometheus"]["command"]
    return [arg for arg in command if arg.startswith("--enable-feature=")]


@pytest.fixture(scope="module")
def prometheus(traced_gateway: RunningGateway, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prom]:
    tmp = tmp_path_factory.mktemp("prometheus")
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config.pop("rule_files", None)
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "enginegate")
    job["static_configs"] = [{"targets": [f"127.0.0.1:{traced_gateway.port}"]}]
    config["scrape_configs"] = [job]
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    features = compose_prometheus_features()
    assert "--enable-feature=exemplar-storage" in features
    port = free_port()
    log = (tmp / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [str(PROMETHEUS), f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn", *features],
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
        prom.wait_for("the traced gateway's target up", target_up)
        yield prom
    finally:
        stop(process)
        log.close()


def exemplar_trace_ids(prom: Prom, metric: str, since: float) -> set[str]:
    r = prom.client.get("/api/v1/query_exemplars", params={"query": f"{metric}_bucket", "start": since - 60,
                                                            "end": time.time() + 60})
    body: dict[str, Any] = r.json()
    assert r.status_code == 200 and body["status"] == "success", body
    return {e["labels"].get("trace_id", "") for series in body["data"] for e in series["exemplars"]}


def test_a_slow_bucket_links_to_the_requests_trace(prometheus: Prom, traced_gateway: RunningGateway,
                                                   receiver: Receiver) -> None:
    header, trace_id = traceparent()
    since = time.time()
    client = openai.OpenAI(base_url=traced_gateway.base_url, api_key="unused", max_retries=0, timeout=120)
    chunks = list(client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Name three colours."}], max_tokens=12, temperature=0,
        stream=True, stream_options={"include_usage": True}, extra_headers={"traceparent": header}))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 1

    missing: list[str] = list(LATENCY)
    deadline = time.monotonic() + GUARD_S
    while missing and time.monotonic() < deadline:
        missing = [m for m in missing if trace_id not in exemplar_trace_ids(prometheus, m, since)]
        time.sleep(0.5)
    assert not missing, f"no exemplar with the request's trace id {trace_id} on {missing}"

    # the exemplar leads to a trace that exists: the server span of that very request
    spans = receiver.wait_for(trace_id, lambda found: any(s.name == "POST /v1/chat/completions" for s in found),
                              timeout=SPANS_GUARD_S)
    assert all(s.trace_id == trace_id for s in spans)


def test_plain_scrapers_still_get_the_classic_text(traced_gateway: RunningGateway) -> None:
    plain = httpx.get(traced_gateway.url + "/metrics", timeout=30)
    assert plain.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "# EOF" not in plain.text and "trace_id" not in plain.text
    om = httpx.get(traced_gateway.url + "/metrics", headers={"Accept": "application/openmetrics-text"}, timeout=30)
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    assert om.text.rstrip().endswith("# EOF")
