"""Run the real gateway app (uvicorn, its own event loop) in a thread, for tests that use the openai client."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from gateway.app import create_app
from gateway.config import Settings
from gateway.runtime import Runtime
from tests.gateway_process import listening_socket


@contextmanager
def running_gateway(settings: Settings, runtime: Runtime | None = None) -> Iterator[str]:
    """Start the gateway (engines included, by the app's lifespan); yield its /v1 base URL; stop it."""
    sock = listening_socket()  # held from now: the engines the lifespan starts cannot take the port
    port = sock.getsockname()[1]
    app = create_app(settings, runtime)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    failure: list[BaseException] = []

    def serve() -> None:
        try:
            asyncio.run(server.serve(sockets=[sock]))
        except BaseException as exc:  # reported to the test below
            failure.append(exc)

    thread = threading.Thread(target=serve, name="gateway", daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError(f"gateway did not start: {failure[0] if failure else 'lifespan failed (see log)'}")
        thread.join(0.05)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join()
