from __future__ import annotations

import argparse
import logging
import sys

from pydantic import ValidationError


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("serve", help="run the gateway (OpenAI-compatible API)")
    p.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port to listen on (default 8000)")
    p.add_argument("--model", help="GGUF path, hub reference org/repo/file.gguf, or 'default' (the embedded SmolLM2)")
    p.add_argument("--config", help="YAML config file (see configs/gateway.example.yaml)")
    p.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gateway.app import STARTUP_FAILED, create_app
    from gateway.config import load_settings
    from gateway.modelsource import ModelSourceError
    from gateway.runtime import PlanningError, Runtime
    from gateway.server import build_server
    from gateway.tracing import SamplerError

    try:
        settings = load_settings(args.config, model=args.model, host=args.host, port=args.port, log_level=args.log_level)
    except ValidationError as exc:  # one line per mistake, the field named
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"]) or "config"
            print(f"enginegate: invalid configuration: {where}: {error['msg']}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError) as exc:
        print(f"enginegate: invalid configuration: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        runtime = Runtime.build(settings)
    except (ModelSourceError, PlanningError, KeyError) as exc:
        print(f"enginegate: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    try:
        app = create_app(settings, runtime)
    except SamplerError as exc:  # OTEL_TRACES_SAMPLER(_ARG) or tracing.sampler unreadable
        print(f"enginegate: invalid configuration: {exc}", file=sys.stderr)
        return 2
    server = build_server(app, settings)
    server.run()
    if app.state.startup_error is not None or not server.started:
        return STARTUP_FAILED  # the reason is already logged (lifespan.startup.failed)
    return 0
