"""Debian's chromium driven by Playwright's Python package (`playwright install` is never run), for
the console's tests: a page that counts JavaScript errors, console errors and failed requests as
failures and refuses any request to another origin, and the docs' screenshots.

Screenshots go to the test's tmp dir; with ENGINEGATE_DOCS_SCREENSHOTS=1 also to docs/images/
(how the pictures in README.md and docs/console.md are made:
`ENGINEGATE_DOCS_SCREENSHOTS=1 pytest tests/integration/console tests/integration/obs/test_status_page.py`)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

CHROMIUM = os.environ.get("ENGINEGATE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
GUARD_MS = 120_000  # hang guard for page waits, not a performance assertion
DOCS_IMAGES = Path(__file__).resolve().parents[1] / "docs" / "images"
SCREENSHOTS = os.environ.get("ENGINEGATE_DOCS_SCREENSHOTS") == "1"
LOAD_FAILED = "Failed to load resource: the server responded with a status of"
VIEWPORT = {"width": 1280, "height": 860}

needs_chromium = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                    reason="Debian's chromium is not installed (.ci/run installs it)")


@dataclass
class Watched:
    """A page and what went wrong on it: JS exceptions, console errors, failed or foreign requests, and
    answers >= 400 other than the expected ones (path, status): by default the console's own access check
    (GET /v1/models without a key: 401 when keys are on; GET /admin/keys with a user key: 403)."""

    page: Any
    origin: str
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    refused: list[tuple[str, int]] = field(default_factory=list)
    expected_console: list[str] = field(default_factory=list)  # substrings of console errors a test provokes
    expected_aborts: set[str] = field(default_factory=set)  # paths whose requests the test aborts (Stop)
    expected_status: set[tuple[str, int]] = field(default_factory=lambda: {("/v1/models", 401), ("/admin/keys", 403)})

    def foreign(self) -> list[str]:
        return [u for u in self.requests if not (u.startswith("data:") or _origin(u) == self.origin)]

    def unexpected(self) -> list[tuple[str, int]]:
        return [r for r in self.refused if r not in self.expected_status]

    def check(self) -> None:
        assert not self.errors, self.errors
        assert not self.foreign(), f"requests to another origin: {self.foreign()}"
        assert not self.unexpected(), f"unexpected error answers: {self.unexpected()}"


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


@contextmanager
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def watched_page(b: Any, origin: str) -> Watched:
    """A fresh context (its own sessionStorage) and page watched for errors and foreign requests."""
    page = b.new_context(viewport=VIEWPORT).new_page()
    page.set_default_timeout(GUARD_MS)
    w = Watched(page, origin)

    def console(msg: Any) -> None:
        # Chrome logs every answer >= 400 as "Failed to load resource"; those are checked by path and
        # status below (w.refused), every other console error is a failure.
        if msg.type != "error" or msg.text.startswith(LOAD_FAILED) or any(s in msg.text for s in w.expected_console):
            return
        w.errors.append(f"console error: {msg.text}")

    def response(r: Any) -> None:
        if r.status >= 400:
            w.refused.append((urlsplit(r.url).path, r.status))

    page.on("pageerror", lambda exc: w.errors.append(f"page error: {exc}"))
    page.on("console", console)
    def failed(req: Any) -> None:
        if not (req.failure == "net::ERR_ABORTED" and urlsplit(req.url).path in w.expected_aborts):
            w.errors.append(f"request failed: {req.url} ({req.failure})")

    page.on("requestfailed", failed)
    page.on("request", lambda req: w.requests.append(req.url))
    page.on("response", response)
    return w


def screenshot(page: Any, tmp_path: Path, name: str, full_page: bool = False) -> Path:
    """`name`.png in tmp_path (and docs/images/ under ENGINEGATE_DOCS_SCREENSHOTS=1); returns the tmp copy."""
    out = tmp_path / f"{name}.png"
    page.screenshot(path=str(out), full_page=full_page)
    assert out.stat().st_size > 0
    if SCREENSHOTS:
        DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out, DOCS_IMAGES / f"{name}.png")
    return out
