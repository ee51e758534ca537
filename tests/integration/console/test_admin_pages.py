"""The console's Models, Keys & usage and Live requests pages in a real headless Chromium (tests/browser.py:
JavaScript and console errors and any request to another origin fail a test) against a real gateway
serving the embedded model behind a config-file admin key.

- An admin creates a key in the console (its secret shown once), a user pastes it and chats in the
  playground, the admin revokes it and the user's next message shows the API's 401.
- The models page shows the plan's reasons, features and replicas.
- A request sent with curl while the live-requests page is open appears as a row."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.browser import Watched, browser, needs_chromium, screenshot, watched_page
from tests.gateway_process import RunningGateway, gateway

pytestmark = [pytest.mark.integration, needs_chromium]
ADMIN_KEY = "consoleapi-admin-secret-7b21"
MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def gw() -> Iterator[RunningGateway]:
    state = Path(tempfile.mkdtemp(prefix="enginegate-consoleapi-"))
    yaml = (f"api_keys:\n  - {{key: {ADMIN_KEY}, role: admin, name: ops}}\n"
            f"tenancy: {{path: \"{state / 'keys.sqlite3'}\"}}\n"
            f"response_store: {{path: \"{state / 'responses.sqlite3'}\"}}\n")
    with gateway(config_yaml=yaml) as running:
        yield running


@pytest.fixture(scope="module")
def chromium() -> Iterator[object]:
    with browser() as b:
        yield b


def opened(b: object, gw: RunningGateway, key: str, tab: str, note: str) -> Watched:
    """A fresh tab (its own sessionStorage) at `tab`, with `key` typed in the key box."""
    w = watched_page(b, gw.url)
    w.page.goto(gw.url + "/#/" + tab)
    w.page.fill("#key", key)
    w.page.click("#key-use")
    w.page.wait_for_function("t => document.getElementById('access').textContent.includes(t)", arg=note)
    return w


def used_by_teammate(gw: RunningGateway) -> None:
    for _ in range(100):
        rows = httpx.get(gw.url + "/admin/usage", params={"key": "teammate"},
                         headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=10).json()["data"]
        if rows:
            return
        time.sleep(0.1)
    raise AssertionError("no usage row for teammate")


def send(w: Watched, text: str) -> int:
    """Type a message in the playground and press Send; the status of its API answer."""
    page = w.page
    page.get_by_role("textbox", name="Message").fill(text)
    with page.expect_response(lambda r: r.url.endswith("/v1/chat/completions")) as answer:
        page.get_by_role("button", name="Send").click()
    return answer.value.status


def test_admin_creates_a_key_user_chats_admin_revokes_user_gets_401(chromium, gw: RunningGateway, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    admin = opened(chromium, gw, ADMIN_KEY, "keys", "Admin key")
    page = admin.page
    page.fill("#new-key input[name=name]", "teammate")
    page.fill("#new-key input[name=rpm]", "30")
    page.get_by_role("button", name="Create key").click()
    secret = page.locator("#new-secret").input_value()
    assert secret and page.locator("tr[data-key=teammate]").inner_text().count("30 req/min") == 1
    assert secret not in page.locator("#keys").inner_text()  # the secret is shown once, never in the list

    user = opened(chromium, gw, secret, "playground", "User key")
    assert send(user, "Say hello.") == 200

    used_by_teammate(gw)  # usage is written after the answer, by the tenancy's writer task
    page.reload()  # the usage of that chat in the chart and the headroom table
    page.locator("#usage-chart rect[data-tenant=teammate]").first.wait_for()
    limits = page.locator("tr[data-tenant=teammate]").inner_text()
    assert "1 / 30" in limits
    screenshot(page, tmp_path, "console-keys", full_page=True)

    page.locator("tr[data-key=teammate]").get_by_role("button", name="Revoke").click()
    page.locator("tr[data-key=teammate].revoked").wait_for()
    user.expected_status |= {("/v1/chat/completions", 401)}
    assert send(user, "Still there?") == 401
    user.page.get_by_text("Incorrect, revoked or expired API key.").last.wait_for()
    admin.check()
    user.check()


def test_the_models_page_shows_the_plan_reasons_features_and_replicas(chromium, gw: RunningGateway, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    w = opened(chromium, gw, ADMIN_KEY, "models", "Admin key")
    card = w.page.locator(f"section.card[data-model='{MODEL}']")
    card.locator(".reasons li").first.wait_for()
    assert "llama.cpp" in card.locator(".reasons").inner_text()  # why the planner chose it
    assert card.locator("[data-field=state]").inner_text() == "ready"
    assert "kv_cache" in card.locator("table.features").inner_text()
    assert "closed" in card.locator("table.replicas tr[data-replica='0']").inner_text()  # the breaker
    w.expected_status |= {(f"/admin/engines/{MODEL}/logs", 400)}
    card.get_by_role("button", name="Engine log").click()  # in-process llama.cpp keeps none: the API says so
    card.locator("pre.log").get_by_text("runs in-process").wait_for()
    screenshot(w.page, tmp_path, "console-models", full_page=True)
    w.check()


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_a_request_sent_with_curl_appears_live(chromium, gw: RunningGateway, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    w = opened(chromium, gw, ADMIN_KEY, "requests", "Admin key")
    w.page.locator("#live-state.on").wait_for()
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Count to three."}],
                       "max_tokens": 16, "stream": True})
    done = subprocess.run(["curl", "-sS", "-D", "-", "-o", "/dev/null", gw.url + "/v1/chat/completions",
                           "-H", f"Authorization: Bearer {ADMIN_KEY}", "-H", "Content-Type: application/json", "-d", body],
                          capture_output=True, text=True, timeout=300, check=True)
    headers = dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    row = w.page.locator(f"tr[data-id='{headers['x-enginegate-request-id'].strip()}']")
    row.wait_for()
    cells = row.locator("td").all_inner_texts()
    assert cells[1] == "ops" and cells[2] == MODEL and cells[4] == "200" and cells[5] == "llamacpp/0" and cells[6] == "yes"
    assert float(cells[8]) > 0  # its TTFT, from the gateway's record
    assert "Count" not in w.page.locator("#request-rows").inner_text()  # never the prompt
    screenshot(w.page, tmp_path, "console-requests", full_page=True)
    assert httpx.get(gw.url + "/admin/requests", params={"id": headers["x-enginegate-request-id"].strip()},
                     headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=10).json()["data"][0]["stream"] is True
    w.check()
