"""GET / (the console's page) and GET /console/<file> (its scripts and styles), from static/.

Every answer carries a strict Content-Security-Policy: nothing but this origin's own files run or
load, no inline script or style, no frames, no forms posting anywhere. The files are read once at
import (the set is fixed: a path outside it is a 404 in the API's shape, never a filesystem walk)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.api.errors import APIError, echoed

router = APIRouter()
STATIC = Path(__file__).resolve().parent / "static"
PREFIX = "/console/"
MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".txt": "text/plain; charset=utf-8",
}
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",  # frame-ancestors for browsers that predate it
    # Revalidate every time (the names carry no content hash); the ETag makes that a 304.
    "Cache-Control": "no-cache",
}


@dataclass(frozen=True)
class StaticFile:
    body: bytes
    media_type: str
    etag: str


def load(root: Path) -> dict[str, StaticFile]:
    """Relative path (posix) -> file, for every file under `root` whose suffix has a media type."""
    files: dict[str, StaticFile] = {}
    if not root.is_dir():
        return files
    for path in sorted(root.rglob("*")):
        media_type = MEDIA_TYPES.get(path.suffix)
        if media_type is None or not path.is_file():
            continue
        body = path.read_bytes()
        files[path.relative_to(root).as_posix()] = StaticFile(body, media_type, '"' + hashlib.sha256(body).hexdigest()[:32] + '"')
    return files


FILES = load(STATIC)


def answer(name: str, if_none_match: str | None) -> Response:
    file = FILES.get(name)
    if file is None:
        raise APIError(404, f"no console file {echoed(name)!r}", code="not_found", headers=SECURITY_HEADERS)
    headers = {**SECURITY_HEADERS, "ETag": file.etag}
    if if_none_match is not None and file.etag in (t.strip() for t in if_none_match.split(",")):
        return Response(status_code=304, headers=headers)
    return Response(file.body, media_type=file.media_type, headers=headers)


@router.get("/", include_in_schema=False)
async def console_page(request: Request) -> Response:
    return answer("index.html", request.headers.get("if-none-match"))


@router.get(PREFIX + "{name:path}", include_in_schema=False)
async def console_file(request: Request, name: str) -> Response:
    return answer(name, request.headers.get("if-none-match"))
