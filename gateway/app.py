"""create_app(settings) -> the FastAPI app; its lifespan owns the runtime (engines) and metrics."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from adapters.base import EngineError

from gateway import console
from gateway.api import (
    admin_keys,
    admin_models,
    admin_requests,
    chat,
    completions,
    embeddings,
    engines,
    health,
    messages,
    models,
    observe,
    responses,
    tokenize,
)
from gateway.api.errors import install_error_handlers
from gateway.api.hot_routes import HotRoutes
from gateway.api.response_store import StoreUnavailable
from gateway.api.openapi import install_openapi
from gateway.config import Settings
from gateway.drain import Drain, DrainMiddleware
from gateway.exposure import exposure_warnings
from gateway.metrics import GatewayMetrics, MetricsMiddleware
from gateway.middleware import BodyLimitMiddleware
from gateway.recent import RecentRequests
from gateway.runtime import Runtime
from gateway.tenancy.middleware import AuthMiddleware
from gateway.tenancy.setup import build_tenancy, open_database
from gateway import tracing

log = logging.getLogger("enginegate")
STARTUP_FAILED = 3  # the CLI's exit status when an engine cannot start


def create_app(settings: Settings, runtime: Runtime | None = None) -> FastAPI:
    """`runtime=None` builds one from the settings at start-up (detect, plan, load engines)."""
    # FastAPI's own OpenTelemetry (0.165+) stays off: the gateway's spans (gateway/tracing/asgi.py) also name
    # the routes served past the router, and its metrics are Prometheus'. On, FastAPI asks the global meter
    # and logger providers (environment reads) on every request: ~1.5 % of a relayed stream's CPU.
    app = FastAPI(title="enginegate", version="0.1.0", telemetry={"tracing": False, "metrics": False, "logs": False})
    app.router.lifespan = _lifespan(app, settings, runtime)  # type: ignore[method-assign]
    app.state.metrics = GatewayMetrics()
    app.state.settings = settings
    app.state.database = open_database(settings)  # the one pool every store of this gateway shares
    app.state.response_store = responses.build_store(settings, app.state.database)
    app.state.drain = Drain(settings.shutdown_grace_seconds, settings.retry_after_seconds)
    app.state.recent = RecentRequests(settings.recent_requests)
    app.state.drain.on_start.append(app.state.recent.close)
    app.state.startup_error = None
    app.state.tenancy = build_tenancy(settings, app.state.metrics.registry, app.state.database)
    install_error_handlers(app)
    install_openapi(app)
    for module in (chat, completions, embeddings, tokenize, responses, messages, models, health, observe, console, engines, admin_models, admin_keys,
                   admin_requests):
        app.include_router(module.router)
    # Outermost first at request time: metrics see every request, the drain refuses new ones,
    # auth before the body is read; the generation routes innermost, past the router.
    hot = {
        "/v1/chat/completions": chat.chat_completions, "/v1/completions": completions.completions,
        "/v1/embeddings": embeddings.embeddings, "/v1/responses": responses.create_response,
        "/v1/messages": messages.messages, "/v1/messages/count_tokens": messages.count_tokens,
    }
    app.add_middleware(HotRoutes, routes=hot)
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_body_bytes, timeout=settings.body_timeout_seconds)
    app.add_middleware(AuthMiddleware, tenancy=app.state.tenancy, retry_after_seconds=settings.retry_after_seconds)
    app.add_middleware(DrainMiddleware, drain=app.state.drain)
    app.add_middleware(messages.AnthropicDialectMiddleware)  # outside auth and drain: their errors leave in Anthropic's shape too
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics, recent=app.state.recent)
    app.state.tracing = tracing.configure(settings.tracing)
    if tracing.switch.ON:  # outermost: the server span holds everything, metrics included
        from gateway.tracing.asgi import TracingMiddleware

        app.add_middleware(TracingMiddleware, hot_paths=hot)
    return app


def _lifespan(app: FastAPI, settings: Settings, runtime: Runtime | None) -> ASGIApp:
    """The ASGI lifespan: start the engines, stop them at shutdown.

    An engine that cannot start fails start-up with its precise message (what is missing, how to
    install it) as `lifespan.startup.failed`: the server logs that one line and exits (the CLI
    with status 3); engines already started are stopped first. Nothing exits the process here."""

    async def lifespan(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()  # lifespan.startup
        try:
            await app.state.response_store.check()
        except StoreUnavailable as exc:  # before any engine starts: one line naming the path
            app.state.startup_error = str(exc)
            await send({"type": "lifespan.startup.failed", "message": f"enginegate: cannot start: {exc}"})
            return
        rt = runtime or Runtime.build(settings)
        app.state.runtime = rt
        rt.lifecycles.observer = app.state.metrics
        try:
            await rt.start()
        except EngineError as exc:
            await rt.stop()
            app.state.startup_error = exc.message
            await send({"type": "lifespan.startup.failed", "message": f"enginegate: cannot start: {exc.message}"})
            return
        except BaseException:
            await rt.stop()
            raise
        await app.state.tenancy.start()
        warnings = exposure_warnings(settings, keys_on=await app.state.tenancy.required())
        for warning in warnings:
            log.warning("%s", warning)
        print(rt.summary(settings.host, settings.port, store=app.state.response_store.describe(),
                         warnings=tuple(warnings)), file=sys.stderr, flush=True)
        # What start-up made (modules, the app, engines' state) lives as long as the process: frozen,
        # the collector stops walking it on every full collection (py-spy: ~10% of a relayed
        # request's samples were in the collector).
        gc.collect()
        gc.freeze()
        await send({"type": "lifespan.startup.complete"})
        await receive()  # lifespan.shutdown
        app.state.recent.close()  # live request streams end (the drain ended them already under `serve`)
        try:
            await rt.stop()
        finally:
            try:
                if tracing.switch.ON:  # what is buffered leaves before the process does (bounded)
                    await asyncio.to_thread(tracing.flush)
                await app.state.tenancy.close()  # usage still buffered: written, else spooled
                await app.state.response_store.close()
            finally:
                try:
                    if app.state.database is not None:
                        await app.state.database.close()
                finally:
                    await send({"type": "lifespan.shutdown.complete"})

    return lifespan
