"""The generation routes, dispatched by plain ASGI past FastAPI's router.

FastAPI's exception middleware, router, route wrappers and dependency solver cost a relayed
request about 15 % of the gateway's CPU, and add a dozen frames that every wakeup of the
request's coroutine climbs back through (benchmarks/relay_overhead.py). These endpoints take only
`request: Request`, so nothing FastAPI would resolve for them is lost: `HotRoutes`, the innermost
middleware, calls them itself for POST on their exact path. They stay registered with FastAPI as
well (OpenAPI, 405 for another method, a trailing slash's redirect), and an exception they raise
goes to the handler the app registered for it, found the way Starlette's exception middleware
finds it (the first class of the exception's MRO with a handler); one without a handler (and
the catch-all `Exception` handler's) goes on to the server-error middleware, as through the router.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

Endpoint = Callable[[Request], Awaitable[Response]]


def exception_handler(handlers: Mapping[Any, Callable[..., Any]], exc: Exception) -> Callable[..., Any] | None:
    """The app's handler for `exc` as Starlette's ExceptionMiddleware picks it: by status code for an
    HTTPException, else by the exception's classes in MRO order; never the catch-all (500/Exception),
    which belongs to the server-error middleware outside."""
    if isinstance(exc, HTTPException) and exc.status_code in handlers:
        return handlers[exc.status_code]
    for cls in type(exc).__mro__:
        if cls is Exception:
            return None
        if cls in handlers:
            return handlers[cls]
    return None


class HotRoutes:
    def __init__(self, app: ASGIApp, routes: Mapping[str, Endpoint]) -> None:
        self.app = app
        self.routes = dict(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = self.routes.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if endpoint is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive, send)
        try:
            response = await endpoint(request)
        except Exception as exc:
            handler = exception_handler(scope["app"].exception_handlers, exc)
            if handler is None:
                raise
            response = handler(request, exc)
            if inspect.isawaitable(response):
                response = await response
        await response(scope, receive, send)
