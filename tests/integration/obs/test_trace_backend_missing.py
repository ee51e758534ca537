"""Compose's default when its trace backend is missing (CI's podman stack has no Jaeger image): the
gateways export to a name that does not resolve. They must keep serving, and /metrics keep answering
in both formats, exemplars included (they name traces the backend never got, which is all a missing
backend can cost)."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.gateway_process import gateway

pytestmark = pytest.mark.integration


def test_an_unresolvable_trace_backend_costs_nothing_but_the_traces() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger.invalid:4318", "OTEL_BSP_SCHEDULE_DELAY": "200"}
    with gateway(env=env) as gw:
        client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=120)
        for _ in range(2):  # the second after the exporter has failed at least once
            chunks = list(client.chat.completions.create(
                model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True,
                stream_options={"include_usage": True}))
            assert chunks[-1].usage is not None
        om = httpx.get(gw.url + "/metrics", headers={"Accept": "application/openmetrics-text"}, timeout=30)
        assert om.status_code == 200 and 'trace_id="' in om.text
        plain = httpx.get(gw.url + "/metrics", timeout=30)
        assert plain.status_code == 200 and "trace_id" not in plain.text
        assert "tracing on" in gw.log()
