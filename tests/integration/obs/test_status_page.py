"""The console's status tab in a real headless Chromium (Debian's /usr/bin/chromium driven by
Playwright's Python package; `playwright install` is never run): it loads, shows the embedded model
ready with its engine and why, the detected hardware, and its live figures change after traffic.
JavaScript and console errors and any request to another origin fail it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.browser import Watched, browser, needs_chromium, screenshot, watched_page
from tests.gateway_process import RunningGateway as Gateway
from tests.integration.obs.support import send_traffic

pytestmark = [pytest.mark.integration, needs_chromium]


@pytest.fixture(scope="module")
def page(plain_gateway: Gateway) -> Iterator[object]:
    with browser() as b:
        w: Watched = watched_page(b, plain_gateway.url)
        w.page.goto(plain_gateway.url + "/#/status")
        yield w.page
        w.check()


def test_page_shows_ready_model_engine_reason_and_hardware(page, plain_gateway: Gateway) -> None:  # type: ignore[no-untyped-def]
    page.wait_for_selector("#overall.ready")
    row = page.locator("#models tr").first
    row.locator("td[data-field=ready].ready").wait_for()
    cells = row.locator("td").all_inner_texts()
    assert cells[0] == "smollm2-135m-instruct" and cells[1] == "llamacpp" and cells[2] == "ready"
    assert cells[5] == "off"  # the plan's speculation decision (in-process llama.cpp has none)
    assert "llama.cpp" in cells[6]  # the planner's reason
    assert "architecture: " in page.inner_text("#hardware")  # the detected CPU, summarised
    assert "No keys configured" in page.inner_text("#access")  # an open gateway says so


def test_figures_change_after_traffic(page, plain_gateway: Gateway, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    page.wait_for_function("document.getElementById('total-requests').textContent !== '-'")
    before = {k: page.inner_text(f"#{k}") for k in ("total-requests", "total-tokens", "ttft")}
    send_traffic(plain_gateway.url)
    page.wait_for_function(
        "n => Number(document.getElementById('total-requests').textContent) > n", arg=float(before["total-requests"]))
    page.wait_for_function("document.getElementById('rps').textContent !== '-'")
    after = {k: page.inner_text(f"#{k}") for k in ("total-requests", "total-tokens", "ttft")}
    assert float(after["total-tokens"]) > float(before["total-tokens"])
    assert after["ttft"] != "-" and float(after["ttft"]) > 0
    screenshot(page, tmp_path, "status", full_page=True)
