"""The status page in a real headless Chromium (Debian's /usr/bin/chromium driven by Playwright's
Python package; `playwright install` is never run): it loads, shows the embedded model ready with
its engine and why, the detected hardware, and its live figures change after traffic."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.gateway_process import RunningGateway as Gateway
from tests.integration.obs.support import send_traffic

CHROMIUM = os.environ.get("ENGINEGATE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
GUARD_MS = 120_000  # hang guard for page waits, not a performance assertion

playwright_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (.ci/run installs it)"),
]


@pytest.fixture(scope="module")
def page(plain_gateway: Gateway) -> Iterator[object]:
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page()
            page.set_default_timeout(GUARD_MS)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("requestfailed", lambda req: errors.append(f"request failed: {req.url}"))
            page.goto(plain_gateway.url + "/")
            yield page
            assert not errors, errors
        finally:
            browser.close()


def test_page_shows_ready_model_engine_reason_and_hardware(page, plain_gateway: Gateway) -> None:  # type: ignore[no-untyped-def]
    page.wait_for_selector("#overall.ready")
    row = page.locator("#models tr").first
    row.locator("td[data-field=ready].ready").wait_for()
    cells = row.locator("td").all_inner_texts()
    assert cells[0] == "smollm2-135m-instruct" and cells[1] == "llamacpp" and cells[2] == "ready"
    assert cells[5] == "off"  # the plan's speculation decision (in-process llama.cpp has none)
    assert "llama.cpp" in cells[6]  # the planner's reason
    assert "architecture: " in page.inner_text("#hardware")  # the detected CPU, summarised


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
    page.screenshot(path=str(tmp_path / "status.png"), full_page=True)
    assert (tmp_path / "status.png").stat().st_size > 0
