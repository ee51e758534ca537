"""What does tracing cost per request? The relay with tracing off, on with every request sampled
(`on-1.0`) and on with 1 % sampled (`on-0.01`, parentbased_traceidratio: no caller's traceparent, so
the gateway's ratio decides), interleaved round by round in one run.

    python -m benchmarks.tracing_overhead [--requests 2000] [--rounds 3] [--receiver sink|phoenix] [--before REV]

`--before REV` adds `off@before`: REV's tree (`git archive`, e.g. the commit before tracing) served in the
same interleaved run, so "off costs nothing" is a measurement: off against off@before.

Upstream: the engine emulator on loopback (vLLM style, instant). Each variant is the real app
(`create_app`) under uvicorn (uvloop + httptools, one worker) relaying through the `openai` adapter,
exporting OTLP/HTTP with the SDK's batch processor. The receiver: `sink` (default), an aiohttp
server in its own process that reads each export and answers 200 (the exporter's whole cost on the
gateway's side, encoding and POSTing, without a trace store competing for the CPU), or `phoenix`, a
real Arize Phoenix (tests/otlp_receiver.py; its ingestion shares the CPU). Reports p50 latency at
concurrency 1 and requests/s at concurrency 32, each the median of the rounds, and each variant
against off.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

import httpx

from benchmarks.harness import BODY, REPO_ROOT, load, spawn, stop, wait_http
from benchmarks.tenancy_overhead import export_revision
from tests.emulators.fixture import free_port

VARIANTS: dict[str, dict[str, str]] = {
    "off": {},
    "on-1.0": {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1.0"},
    "on-0.01": {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01"},
}


def serve_gateway(port: int, upstream: str) -> int:
    import uvicorn

    from adapters import registry
    from adapters.config import EngineConfig
    from gateway.app import create_app
    from gateway.config import Settings
    from gateway.routing import Admission, Backend, ModelRegistry
    from gateway.runtime import Runtime

    models = ModelRegistry()
    config = EngineConfig(source="fast", name="fast", options={"base_url": upstream, "upstream_model": "emulated-model"})
    models.add(Backend(model_id="fast", adapter=registry.create("openai", config), admission=Admission(1024, 4096)))
    settings = Settings(port=port)
    app = create_app(settings, Runtime(settings=settings, models=models))
    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", log_level="warning",
                access_log=False, lifespan="on")
    return 0


def serve_sink(port: int) -> int:
    from aiohttp import web

    received = 0

    async def traces(request: web.Request) -> web.Response:
        nonlocal received
        received += len(await request.read())
        return web.Response(body=b"", content_type="application/x-protobuf")

    async def health(_: web.Request) -> web.Response:
        return web.Response(text=str(received))

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_post("/v1/traces", traces)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, print=None)
    return 0


def spawn_env(module_args: list[str], env: dict[str, str], root: Path = REPO_ROOT) -> subprocess.Popen[bytes]:
    full = {**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}, "PYTHONPATH": str(root), **env}
    command = module_args if module_args[0].endswith(".py") else ["-m", *module_args]
    return subprocess.Popen([sys.executable, *command], cwd=root, env=full,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


async def measure(urls: dict[str, str], requests: int, rounds: int) -> dict[str, dict[str, float]]:
    body = {**BODY, "model": "fast"}
    p50: dict[str, list[float]] = {v: [] for v in urls}
    rps: dict[str, list[float]] = {v: [] for v in urls}
    for url in urls.values():
        await load(url, 8, 200, body)  # warm-up
    for _ in range(rounds):
        for variant, url in urls.items():  # interleaved: the machine's noise falls on every variant alike
            p50[variant].append((await load(url, 1, max(200, requests // 4), body)).p50_ms)
            rps[variant].append((await load(url, 32, requests, body)).rps)
    return {v: {"p50_ms": statistics.median(p50[v]), "rps32": statistics.median(rps[v])} for v in urls}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--receiver", choices=("sink", "phoenix"), default="sink")
    p.add_argument("--before", metavar="REV", help="also serve REV's gateway, untraced, in the same run")
    p.add_argument("--serve-gateway", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--serve-sink", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--upstream", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_gateway:
        return serve_gateway(args.port, args.upstream)
    if args.serve_sink:
        return serve_sink(args.port)

    upstream_port = free_port()
    procs = [spawn(["tests.emulators.engine_emulator", "--style", "vllm", "--port", str(upstream_port), "--tokens", "16"])]
    with ExitStack() as stack:
        try:
            wait_http(f"http://127.0.0.1:{upstream_port}/health", procs[0])
            if args.receiver == "phoenix":
                from tests.otlp_receiver import phoenix

                endpoint = stack.enter_context(phoenix()).otlp_endpoint
            else:
                sink_port = free_port()
                procs.append(spawn_env(["benchmarks.tracing_overhead", "--serve-sink", "--port", str(sink_port)], {}))
                wait_http(f"http://127.0.0.1:{sink_port}/health", procs[-1])
                endpoint = f"http://127.0.0.1:{sink_port}"
            urls: dict[str, str] = {}
            served: list[tuple[str, dict[str, str], Path]] = [(name, env, REPO_ROOT) for name, env in VARIANTS.items()]
            if args.before:
                old = export_revision(args.before, Path(stack.enter_context(tempfile.TemporaryDirectory())) / "before")
                served.append(("off@before", {}, old))
            for name, env, root in served:
                port = free_port()
                traced = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, **env} if env else {}
                # this file run as a script, importing the gateway of `root` (this tree, or REV's)
                procs.append(spawn_env([__file__, "--serve-gateway", "--port", str(port),
                                        "--upstream", f"http://127.0.0.1:{upstream_port}"], traced, root))
                wait_http(f"http://127.0.0.1:{port}/ready", procs[-1])
                urls[name] = f"http://127.0.0.1:{port}/v1/chat/completions"
            r = asyncio.run(measure(urls, args.requests, args.rounds))
            exported = httpx.get(f"{endpoint}/health", timeout=5).text if args.receiver == "sink" else "see Phoenix"
        finally:
            for proc in reversed(procs):
                stop(proc)
    off = r["off"]
    print(f"receiver: {args.receiver} (received {exported} bytes of OTLP); {args.rounds} rounds of {args.requests} requests")
    print("| tracing | p50 c=1 (ms) | added p50 | req/s c=32 | of off |")
    print("|---|---|---|---|---|")
    for name, v in r.items():
        print(f"| {name} | {v['p50_ms']:.2f} | {v['p50_ms'] - off['p50_ms']:+.2f} | {v['rps32']:.0f} | "
              f"{v['rps32'] / off['rps32']:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
