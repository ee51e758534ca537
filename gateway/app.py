"""create_app(settings) -> the FastAPI app; its lifespan owns the runtime (engines) and metrics."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from adapters.base import EngineError

from gateway.api import chat, completions, embeddings, engines, health, messages, models, observe, responses, status
from gateway.api.errors import install_error_handlers
from gateway.config import Settings
from gateway.metrics import GatewayMetrics, MetricsMiddleware
from gateway.middleware import APIKeyMiddleware, BodyLimitMiddleware
from gateway.runtime import Runtime

log = logging.getLogger("enginegate")
STARTUP_FAILED = 3


def create_app(settings: Settings, runtime: Runtime | None = None) -> FastAPI:
    """`runtime=None` builds one from the settings at start-up (detect, plan, load engines)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        rt = runtime or Runtime.build(settings)
        app.state.runtime = rt
        try:
            try:
                await rt.start()
            except EngineError as exc:
                # A precise message (what is missing, how to install it), not a lifespan traceback;
                # engines already started are stopped first, so nothing is left behind.
                await rt.stop()
                print(f"enginegate: cannot start: {exc.message}", file=sys.stderr, flush=True)
                os._exit(STARTUP_FAILED)
            print(rt.summary(settings.host, settings.port), file=sys.stderr, flush=True)
            yield
        finally:
            await rt.stop()

    app = FastAPI(title="enginegate", version="0.1.0", lifespan=lifespan)
    app.state.metrics = GatewayMetrics()
    app.state.settings = settings
    app.state.response_store = responses.build_store(settings)
    install_error_handlers(app)
    for module in (chat, completions, embeddings, responses, messages, models, health, observe, status, engines):
        app.include_router(module.router)
    # Outermost first at request time: metrics see every request, auth before the body is read.
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_body_bytes)
    app.add_middleware(APIKeyMiddleware, keys=settings.api_keys)
    app.add_middleware(messages.AnthropicDialectMiddleware)  # outside auth: its 401 leaves in Anthropic's shape too
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    return app
