"""A real request's trace, as a trace UI shows it: a streamed chat with a caller's traceparent through a
traced gateway (the embedded model) into a real OTLP receiver (Phoenix), whose own UI, in Debian's
chromium driven by Playwright, shows that trace with the gateway's spans. With
ENGINEGATE_DOCS_SCREENSHOTS=1 the picture is written to docs/images/trace-phoenix.png (docs/tracing.md
shows it); otherwise to the test's temporary folder."""

from __future__ import annotations

import os
from pathlib import Path

import openai
import pytest

from tests.gateway_process import REPO_ROOT
from tests.gateway_process import RunningGateway as Gateway
from tests.browser import ARGS, CHROMIUM, GUARD_MS
from tests.integration.obs.traced import SPANS_GUARD_S, traceparent
from tests.otlp_receiver import Receiver

playwright_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (.ci/run installs it)"),
]
DOCS_PICTURE = REPO_ROOT / "docs" / "images" / "trace-phoenix.png"
GATEWAY_SPANS = ("enginegate.limits", "enginegate.queue", "enginegate.route")


def test_the_trace_ui_shows_a_real_requests_spans(traced_gateway: Gateway, receiver: Receiver, tmp_path: Path) -> None:
    header, trace_id = traceparent()
    client = openai.OpenAI(base_url=traced_gateway.base_url, api_key="unused", max_retries=0, timeout=120)
    chunks = list(client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Name three colours."}], max_tokens=24, temperature=0,
        stream=True, stream_options={"include_usage": True}, extra_headers={"traceparent": header}))
    assert chunks[-1].usage is not None
    spans = receiver.wait_for(trace_id, lambda found: {s.name for s in found} >= {*GATEWAY_SPANS, "POST /v1/chat/completions"},
                              timeout=SPANS_GUARD_S)
    [attempt] = [s for s in spans if s.attributes.get("gen_ai.operation.name") == "chat"]

    picture = DOCS_PICTURE if os.environ.get("ENGINEGATE_DOCS_SCREENSHOTS") == "1" else tmp_path / "trace-phoenix.png"
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 900})
            page.set_default_timeout(GUARD_MS)
            page.goto(f"{receiver.url}/redirects/traces/{trace_id}")  # Phoenix's own link to one trace
            for name in (*GATEWAY_SPANS, attempt.name):
                page.get_by_text(name, exact=True).first.wait_for(state="visible")
            page.get_by_text(attempt.name, exact=True).first.click()  # the attempt's GenAI attributes alongside
            page.wait_for_timeout(1500)  # let the tree's layout settle for the picture
            picture.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(picture))
        finally:
            browser.close()
    assert picture.stat().st_size > 10_000
