"""The console's playground in a real headless Chromium (Debian's, driven by Playwright) against a
real gateway serving the embedded model: a streamed chat grows token by token and then shows its
facts; a forced tool call renders as one; 401, 429 (with its retry time) and 400 (with its param)
show the API's own message; Responses mode chains previous_response_id; "copy as" never holds the
key and the Python snippet runs. Every page fails on a JavaScript or console error and on any
request to another origin."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.browser import Watched, browser, needs_chromium, screenshot, watched_page
from tests.gateway_process import RunningGateway
from tests.integration.console.gateways import ADMIN_KEY, MODEL, SLOW_KEY, USER_KEY, keyed_gateway

TS_DIR = Path(__file__).resolve().parents[2] / "ts"
pytestmark = [pytest.mark.integration, needs_chromium]

WEATHER_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]

# Every distinct text of the newest answer while it is not final, recorded in the page as it changes.
RECORD_STATES = """() => {
  window.__states = [];
  const seen = () => {
    const answers = document.querySelectorAll('[data-role=assistant]');
    const last = answers[answers.length - 1];
    if (!last || last.dataset.state === 'done') return;
    const text = last.querySelector('[data-testid=answer-text]').textContent;
    if (text && window.__states[window.__states.length - 1] !== text) window.__states.push(text);
  };
  new MutationObserver(seen).observe(document.getElementById('pg-transcript'),
    {subtree: true, childList: true, characterData: true, attributes: true});
}"""


@pytest.fixture(scope="module")
def gw() -> Iterator[RunningGateway]:
    with keyed_gateway() as running:
        yield running


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    with browser() as b:
        yield b


@pytest.fixture
def console(chromium: Any, gw: RunningGateway) -> Iterator[Watched]:
    w = watched_page(chromium, gw.url)
    yield w
    w.page.context.close()
    w.check()


def open_playground(w: Watched, gw: RunningGateway, key: str | None, expect: str, models: bool = True) -> Any:
    page = w.page
    page.goto(gw.url + "/")
    if key is not None:
        page.fill("#key", key)
        page.get_by_role("button", name="Use key").click()
    page.wait_for_function("t => document.getElementById('access').textContent.includes(t)", arg=expect)
    if models:
        page.wait_for_selector(f"#pg-model option[value='{MODEL}']", state="attached")
    return page


def send(page: Any, text: str) -> Any:
    """Type and press Send; returns the new answer once it is done or failed."""
    n = page.locator("[data-role=assistant]").count()
    page.get_by_role("textbox", name="Message").fill(text)
    page.get_by_role("button", name="Send", exact=True).click()
    answer = page.locator("[data-role=assistant]").nth(n)
    answer.and_(page.locator("[data-state=done], [data-state=error]")).wait_for()
    return answer


def fact(answer: Any, name: str) -> str:
    return str(answer.locator(f"[data-fact={name}] b").inner_text())


def test_streamed_chat_grows_then_shows_its_facts(console: Watched, gw: RunningGateway, tmp_path: Path) -> None:
    page = open_playground(console, gw, USER_KEY, "User key")
    assert page.evaluate("sessionStorage.getItem('enginegate-key')") == USER_KEY
    assert page.evaluate("document.cookie") == "" and page.context.cookies() == []
    assert USER_KEY not in page.content()  # the typed key is in no page text or attribute
    assert page.locator("textarea#pg-input").count() == 1
    page.fill("#pg-system", "You are a concise assistant.")
    page.fill("#pg-temperature", "0")
    page.fill("#pg-max-tokens", "48")
    page.evaluate(RECORD_STATES)
    answer = send(page, "Write a short poem about the sea.")
    assert answer.get_attribute("data-state") == "done"
    final = answer.locator("[data-testid=answer-text]").inner_text()
    states = page.evaluate("window.__states")
    partial = [s for s in states if s != final]
    assert len(set(partial)) >= 2, f"the answer did not grow progressively: {states!r}"
    assert all(final.startswith(s) for s in partial)  # each state a prefix of the next
    assert float(fact(answer, "ttft").removesuffix(" ms")) > 0
    assert float(fact(answer, "tps")) > 0
    assert fact(answer, "engine") == "llamacpp"  # the x-enginegate-engine header, not the model card's guess
    assert fact(answer, "queue").endswith(" ms") and fact(answer, "request-id")
    answer.locator("[data-fact=decode]").wait_for()  # from the gateway's record of this request
    assert fact(answer, "prefill").endswith(" ms") and fact(answer, "decode").endswith(" ms")
    assert fact(answer, "finish") in ("stop", "length")
    assert fact(answer, "cached")  # usage was asked for (stream_options.include_usage) and shown
    sent = [r for r in console.requests if r.endswith("/v1/chat/completions")]
    assert len(sent) == 1
    # "copy as": the exact request, the key as a placeholder
    answer.get_by_role("button", name="curl").click()
    curl = answer.locator("pre.snippet").inner_text()
    assert "$ENGINEGATE_API_KEY" in curl and USER_KEY not in curl and '"max_tokens": 48' in curl
    assert '"include_usage": true' in curl and "Write a short poem about the sea." in curl
    answer.get_by_role("button", name="TypeScript").click()
    ts = answer.locator("pre.snippet").inner_text()
    assert "process.env.ENGINEGATE_API_KEY" in ts and USER_KEY not in ts
    send(page, "Now make it rhyme.")  # the second turn carries the first
    screenshot(page, tmp_path, "console-playground", full_page=True)


def test_the_python_snippet_is_the_request_and_runs(console: Watched, gw: RunningGateway) -> None:
    page = open_playground(console, gw, USER_KEY, "User key")
    page.fill("#pg-max-tokens", "8")
    page.uncheck("#pg-stream")
    answer = send(page, "Say hi.")
    answer.get_by_role("button", name="Python").click()
    code = answer.locator("pre.snippet").inner_text()
    assert USER_KEY not in code and 'os.environ["ENGINEGATE_API_KEY"]' in code
    env = {**os.environ, "ENGINEGATE_API_KEY": USER_KEY}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed["model"] == MODEL and printed["usage"]["completion_tokens"] <= 8


def test_the_typescript_snippet_runs_with_the_official_sdk(console: Watched, gw: RunningGateway, tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None or not (TS_DIR / "node_modules" / "openai").is_dir():
        pytest.skip("node or tests/ts/node_modules (npm ci in tests/ts, as .ci/run does) is missing")
    page = open_playground(console, gw, USER_KEY, "User key")
    page.fill("#pg-max-tokens", "8")
    answer = send(page, "Say hi.")  # streamed: the snippet iterates the stream
    answer.get_by_role("button", name="TypeScript").click()
    code = answer.locator("pre.snippet").inner_text()
    assert USER_KEY not in code
    (tmp_path / "node_modules").symlink_to(TS_DIR / "node_modules")
    (tmp_path / "snippet.mjs").write_text(code)  # plain JavaScript as well as TypeScript
    env = {**os.environ, "ENGINEGATE_API_KEY": USER_KEY}
    done = subprocess.run([node, "snippet.mjs"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip()  # the streamed text


def test_a_forced_tool_call_renders_as_a_call(console: Watched, gw: RunningGateway, tmp_path: Path) -> None:
    page = open_playground(console, gw, USER_KEY, "User key")
    page.fill("#pg-tools", json.dumps(WEATHER_TOOLS, indent=2))
    page.dispatch_event("#pg-tools", "input")
    page.select_option("#pg-tool-choice", "fn:get_weather")
    answer = send(page, "What is the weather in Paris?")
    call = answer.locator("[data-testid=tool-call]")
    assert call.count() == 1
    assert call.locator("[data-testid=tool-name]").inner_text() == "get_weather"
    arguments = json.loads(call.locator("[data-testid=tool-arguments]").inner_text())
    assert isinstance(arguments, dict) and "city" in arguments
    assert fact(answer, "finish") == "tool_calls"
    # the next message is the tool's result, and the model answers it
    assert "get_weather" in page.get_by_role("textbox", name="Message").get_attribute("placeholder")
    page.select_option("#pg-tool-choice", "none")
    after = send(page, '{"temperature_c": 18, "sky": "clear"}')
    assert after.get_attribute("data-state") == "done"
    assert page.locator("[data-role=tool]").count() == 1
    screenshot(page, tmp_path, "console-tool-call", full_page=True)


def test_429_shows_the_retry_time(console: Watched, gw: RunningGateway) -> None:
    page = open_playground(console, gw, SLOW_KEY, "User key")
    page.fill("#pg-max-tokens", "4")
    first = send(page, "Hello.")
    second = send(page, "Hello again.") if first.get_attribute("data-state") == "done" else first
    assert second.get_attribute("data-state") == "error"
    assert second.locator("[data-error=status]").inner_text() == "429"
    retry = second.locator("[data-fact=retry-after] b").inner_text()
    assert retry.endswith(" s") and int(retry.removesuffix(" s")) >= 1
    assert second.locator("[data-testid=error-message]").inner_text()  # the API's own message
    console.expected_status.add(("/v1/chat/completions", 429))


def test_401_and_400_show_the_apis_message_and_fields(console: Watched, gw: RunningGateway) -> None:
    console.expected_status |= {("/v1/models", 401), ("/v1/chat/completions", 401), ("/v1/chat/completions", 400)}
    page = open_playground(console, gw, "not-a-key", "not accepted", models=False)
    page.get_by_role("textbox", name="Message").fill("hi")
    page.get_by_role("button", name="Send", exact=True).click()
    # no model listed for a bad key: the page sends model "", which the gateway refuses at auth first
    answer = page.locator("[data-role=assistant][data-state=error]")
    answer.wait_for()
    assert answer.locator("[data-error=status]").inner_text() == "401"
    assert "API key" in answer.locator("[data-testid=error-message]").inner_text()
    page.fill("#key", USER_KEY)
    page.get_by_role("button", name="Use key").click()
    page.wait_for_selector(f"#pg-model option[value='{MODEL}']", state="attached")
    page.fill("#pg-temperature", "7")
    bad = send(page, "hi")
    assert bad.locator("[data-error=status]").inner_text() == "400"
    assert bad.locator("[data-error=param]").inner_text() == "temperature"
    assert "temperature" in bad.locator("[data-testid=error-message]").inner_text()


def test_responses_mode_chains_previous_response_id(console: Watched, gw: RunningGateway) -> None:
    page = open_playground(console, gw, USER_KEY, "User key")
    page.select_option("#pg-mode", "responses")
    page.fill("#pg-max-tokens", "16")
    bodies: list[dict[str, Any]] = []
    page.on("request", lambda r: bodies.append(json.loads(r.post_data)) if r.url.endswith("/v1/responses") else None)
    first = send(page, "My name is Ada.")
    second = send(page, "What is my name?")
    assert first.get_attribute("data-state") == "done" and second.get_attribute("data-state") == "done"
    assert "previous_response_id" not in bodies[0] and bodies[0]["stream"] is True
    assert bodies[1]["previous_response_id"].startswith("resp")
    assert float(fact(second, "ttft").removesuffix(" ms")) > 0 and fact(second, "finish") in ("completed", "incomplete: max_output_tokens")


def test_admin_key_is_recognised(console: Watched, gw: RunningGateway) -> None:
    open_playground(console, gw, ADMIN_KEY, "Admin key")
    assert console.page.locator("#pg-model option").count() >= 1


def test_csp_header_blocks_an_inline_script(console: Watched, gw: RunningGateway) -> None:
    console.expected_console.append("Content Security Policy")
    response = console.page.goto(gw.url + "/")
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["referrer-policy"] == "no-referrer"
    violated = console.page.evaluate("""() => new Promise((resolve) => {
      document.addEventListener('securitypolicyviolation', (e) => resolve(e.violatedDirective), {once: true});
      const s = document.createElement('script');
      s.textContent = 'window.__inline = 1';
      document.body.append(s);
    })""")
    assert violated.startswith("script-src")
    assert console.page.evaluate("window.__inline === undefined")
