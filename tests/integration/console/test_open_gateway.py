"""The console on a gateway with no keys configured (local use): it says so, needs no key, and the
playground chats; JSON mode and a JSON schema answer with JSON. A stopped stream (the client gone)
leaves the playground usable."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from tests.browser import Watched, browser, needs_chromium, watched_page
from tests.gateway_process import RunningGateway, gateway
from tests.integration.console.gateways import MODEL

pytestmark = [pytest.mark.integration, needs_chromium]


@pytest.fixture(scope="module")
def open_gw() -> Iterator[RunningGateway]:
    with gateway() as running:
        yield running


@pytest.fixture
def watched(open_gw: RunningGateway) -> Iterator[Watched]:
    with browser() as b:
        w = watched_page(b, open_gw.url)
        w.page.goto(open_gw.url + "/")
        w.page.wait_for_function("document.getElementById('access').textContent.includes('No keys configured')")
        w.page.wait_for_selector(f"#pg-model option[value='{MODEL}']", state="attached")
        yield w
        w.check()


@pytest.fixture
def page(watched: Watched) -> Any:
    return watched.page


def send(page: Any, text: str) -> Any:
    n = page.locator("[data-role=assistant]").count()
    page.get_by_role("textbox", name="Message").fill(text)
    page.get_by_role("button", name="Send", exact=True).click()
    answer = page.locator("[data-role=assistant]").nth(n)
    answer.and_(page.locator("[data-state=done], [data-state=error]")).wait_for()
    return answer


@pytest.mark.parametrize(("form", "schema"), [
    ("json_object", None),
    ("json_schema", {"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"]}),
])
def test_json_answers_parse(page: Any, form: str, schema: dict[str, Any] | None) -> None:
    page.select_option("#pg-format", form)
    if schema is not None:
        page.fill("#pg-schema", json.dumps(schema))
    page.fill("#pg-max-tokens", "40")
    page.fill("#pg-temperature", "0")
    answer = send(page, "Name one colour, as JSON.")
    assert answer.get_attribute("data-state") == "done"
    text = answer.locator("[data-testid=answer-text]").inner_text()
    finish = answer.locator("[data-fact=finish] b").inner_text()
    assert text.lstrip().startswith("{")  # the grammar held from the first token
    if schema is not None:  # the schema's grammar leaves no room to ramble: a whole object
        assert finish == "stop" and isinstance(json.loads(text)["colour"], str)
    elif finish == "stop":  # JSON mode allows endless whitespace; a whole answer parses
        assert isinstance(json.loads(text), dict)


def test_a_stopped_stream_leaves_the_playground_usable(watched: Watched) -> None:
    page = watched.page
    watched.expected_aborts.add("/v1/chat/completions")
    page.fill("#pg-max-tokens", "400")
    page.get_by_role("textbox", name="Message").fill("Write a long story about a lighthouse keeper.")
    page.get_by_role("button", name="Send", exact=True).click()
    answer = page.locator("[data-role=assistant]").first
    answer.and_(page.locator("[data-state=streaming]")).wait_for()
    page.get_by_role("button", name="Stop").click()
    answer.and_(page.locator("[data-state=error]")).wait_for()
    assert answer.locator("[data-testid=error-message]").inner_text() == "stopped"
    page.fill("#pg-max-tokens", "8")
    again = send(page, "Say hi.")
    assert again.get_attribute("data-state") == "done"
