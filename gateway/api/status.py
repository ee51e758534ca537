"""GET / : the status page (static HTML + JS from gateway/static, no build step, no CDN)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from starlette.responses import Response

from gateway.api.errors import APIError

router = APIRouter()
STATIC = Path(__file__).resolve().parent.parent / "static"
MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
FILES = {p.name: p for p in STATIC.iterdir() if p.suffix in MEDIA_TYPES} if STATIC.is_dir() else {}
HEADERS = {"Cache-Control": "no-cache"}


def _file(name: str) -> Response:
    path = FILES.get(name)
    if path is None:
        raise APIError(404, f"no static file {name!r}", code="not_found")
    return Response(path.read_bytes(), media_type=MEDIA_TYPES[path.suffix], headers=HEADERS)


@router.get("/", include_in_schema=False)
async def status_page() -> Response:
    return _file("index.html")


@router.get("/static/{name}", include_in_schema=False)
async def static_file(name: str) -> Response:
    return _file(name)
