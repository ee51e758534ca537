"""The console's files: the fixed set under gateway/console/static, their media types, the
security headers on every answer (CSP, nosniff, no referrer), ETag revalidation, and nothing in the
page that loads from another origin or runs inline."""

from __future__ import annotations

import posixpath
import re

import httpx
import pytest
from fastapi import FastAPI

from gateway.api.errors import install_error_handlers
from gateway.console import serving
from gateway.console.serving import CSP, FILES, load

EXPECTED_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
                "frame-ancestors 'none'; base-uri 'none'; form-action 'none'")


def client() -> httpx.AsyncClient:
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(serving.router)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")


def assert_secured(response: httpx.Response) -> None:
    assert response.headers["content-security-policy"] == EXPECTED_CSP
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["referrer-policy"] == "no-referrer"
    assert response.headers["cache-control"] == "no-cache"


def test_the_policy_is_the_strict_one() -> None:
    assert CSP == EXPECTED_CSP


@pytest.mark.parametrize(("path", "media_type"), [
    ("/", "text/html; charset=utf-8"),
    ("/console/app.js", "text/javascript; charset=utf-8"),
    ("/console/dom.js", "text/javascript; charset=utf-8"),
    ("/console/console.css", "text/css; charset=utf-8"),
    ("/console/pages/playground.js", "text/javascript; charset=utf-8"),
    ("/console/pages/status.js", "text/javascript; charset=utf-8"),
])
async def test_each_file_with_its_type_and_the_security_headers(path: str, media_type: str) -> None:
    async with client() as c:
        r = await c.get(path)
    assert r.status_code == 200 and r.headers["content-type"] == media_type
    assert_secured(r)
    assert r.headers["etag"].startswith('"')


@pytest.mark.parametrize("path", ["/console/../serving.py", "/console/%2e%2e/serving.py", "/console/nope.js",
                                  "/console/pages/../../serving.py", "/console/", "/console/static/app.js"])
async def test_anything_outside_the_set_is_a_404_in_the_api_shape(path: str) -> None:
    async with client() as c:
        r = await c.get(path)
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"


async def test_a_matching_etag_is_a_304_without_a_body() -> None:
    async with client() as c:
        first = await c.get("/console/app.js")
        again = await c.get("/console/app.js", headers={"If-None-Match": first.headers["etag"]})
        other = await c.get("/console/app.js", headers={"If-None-Match": '"something-else"'})
    assert again.status_code == 304 and again.content == b""
    assert_secured(again)
    assert other.status_code == 200 and other.content == first.content


def test_no_file_loads_from_another_origin_or_runs_inline() -> None:
    for name, file in FILES.items():
        text = file.body.decode()
        if name.endswith(".html"):
            assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", text), f"{name}: inline script"
            assert "<style" not in text and " style=" not in text, f"{name}: inline style"
            assert not re.search(r"\bon[a-z]+=", text), f"{name}: inline event handler"
        for url in re.findall(r"""(?:src|href)=["']([^"']+)""", text):
            assert url.startswith(("/", "#", "data:")), f"{name} loads {url}"
        assert "innerHTML" not in text, f"{name}: text goes in as text nodes"


def test_only_known_suffixes_are_served(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "pages").mkdir()
    (tmp_path / "a.js").write_text("x")
    (tmp_path / "pages" / "b.js").write_text("y")
    (tmp_path / "secret.py").write_text("z")
    (tmp_path / ".env").write_text("k")
    assert sorted(load(tmp_path)) == ["a.js", "pages/b.js"]
    assert load(tmp_path / "missing") == {}


PLAYGROUND_LOAD = ("index.html", "console.css", "app.js", "dom.js", "sse.js", "snippets.js", "pages/playground.js")


def test_the_playground_loads_light_and_every_import_is_served() -> None:
    assert sum(len(FILES[name].body) for name in PLAYGROUND_LOAD) <= 64 * 1024
    imports = 0
    for name in PLAYGROUND_LOAD:  # each module's static imports are in the served set
        for target in re.findall(r"""^import [^;]*from "(\.{1,2}/[^"]+)";""", FILES[name].body.decode(), re.M):
            imports += 1
            assert posixpath.normpath(posixpath.join(posixpath.dirname(name), target)) in FILES, f"{name} imports {target}"
    assert imports >= 4
