"""What does the gateway add on top of an engine? Direct vs through `create_app`, one run.

    python -m benchmarks.relay_overhead [--requests 3000] [--streams 40]

Upstream: the engine emulator on loopback (vLLM style), instant for the non-streaming runs and
paced (one token per --itl-ms) for the streaming runs. The gateway is the real app
(`gateway.app.create_app`) under uvicorn with uvloop + httptools and ONE worker, serving both
emulators through the `openai` (external) adapter, i.e. the relay in adapters/openai_http.py.
Reports added p50/p99 latency at concurrency 1, requests/s at concurrency 32, added time to
first token, added delay per event, and whether any two events reached the client coalesced.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from adapters import registry
from adapters.config import EngineConfig
from benchmarks.harness import BODY, load, median_ms, spawn, stop, stream_load, wait_http
from gateway.config import Settings
from tests.emulators.fixture import free_port

TARGET_ADDED_P50_MS = 0.5
TARGET_RPS_RATIO = 0.20


def serve_gateway(port: int, fast: str, paced: str) -> int:
    import uvicorn

    from gateway.app import create_app
    from gateway.routing import Admission, Backend, ModelRegistry
    from gateway.runtime import Runtime

    models = ModelRegistry()
    for name, url in (("fast", fast), ("paced", paced)):
        config = EngineConfig(source=name, name=name, options={"base_url": url, "upstream_model": "emulated-model"})
        models.add(Backend(model_id=name, adapter=registry.create("openai", config), admission=Admission(1024, 4096)))
    settings = Settings(port=port)
    app = create_app(settings, Runtime(settings=settings, models=models))
    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", log_level="warning",
                access_log=False, lifespan="on")
    return 0


async def run(direct: str, gateway: str, paced_direct: str, requests: int, streams: int, tokens: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, url, model in (("direct", direct, "emulated-model"), ("gateway", gateway, "fast")):
        body = {**BODY, "model": model}
        await load(url, 8, 300, body)  # warm-up
        c1 = await load(url, 1, max(300, requests // 3), body)
        c32 = await load(url, 32, requests, body)
        out[label] = {"p50_ms": c1.p50_ms, "p99_ms": c1.p99_ms, "rps32": c32.rps}
    for label, url in (("direct_stream", paced_direct), ("gateway_stream", gateway)):
        sr = await stream_load(url, streams, tokens, model="emulated-model" if label == "direct_stream" else "paced")
        out[label] = {"ttft_ms": median_ms(sr.ttfts), "span_ms": median_ms(sr.spans), "events": sr.events,
                      "coalesced": sr.reads_with_several_events, "reads": sr.reads}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--streams", type=int, default=40)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--itl-ms", type=float, default=5.0)
    p.add_argument("--serve-gateway", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--fast", help=argparse.SUPPRESS)
    p.add_argument("--paced", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_gateway:
        return serve_gateway(args.port, args.fast, args.paced)

    fast_port, paced_port, gw_port = free_port(), free_port(), free_port()
    procs = [
        spawn(["tests.emulators.engine_emulator", "--style", "vllm", "--port", str(fast_port), "--tokens", "16"]),
        spawn(["tests.emulators.engine_emulator", "--style", "vllm", "--port", str(paced_port),
               "--tokens", str(args.tokens), "--itl-ms", str(args.itl_ms)]),
    ]
    try:
        wait_http(f"http://127.0.0.1:{fast_port}/health", procs[0])
        wait_http(f"http://127.0.0.1:{paced_port}/health", procs[1])
        procs.append(spawn(["benchmarks.relay_overhead", "--serve-gateway", "--port", str(gw_port),
                            "--fast", f"http://127.0.0.1:{fast_port}", "--paced", f"http://127.0.0.1:{paced_port}"]))
        wait_http(f"http://127.0.0.1:{gw_port}/ready", procs[2])
        r = asyncio.run(run(f"http://127.0.0.1:{fast_port}/v1/chat/completions",
                            f"http://127.0.0.1:{gw_port}/v1/chat/completions",
                            f"http://127.0.0.1:{paced_port}/v1/chat/completions",
                            args.requests, args.streams, args.tokens))
    finally:
        for proc in reversed(procs):
            stop(proc)
    d, g, ds, gs = r["direct"], r["gateway"], r["direct_stream"], r["gateway_stream"]
    added_p50 = g["p50_ms"] - d["p50_ms"]
    ratio = g["rps32"] / d["rps32"]
    per_event = (gs["span_ms"] - ds["span_ms"]) / max(args.tokens - 1, 1)
    print("| measure | direct | through gateway | added | target |")
    print("|---|---|---|---|---|")
    print(f"| latency p50, c=1 (ms) | {d['p50_ms']:.2f} | {g['p50_ms']:.2f} | {added_p50:+.2f} | <= +{TARGET_ADDED_P50_MS} "
          f"{'met' if added_p50 <= TARGET_ADDED_P50_MS else 'MISSED'} |")
    print(f"| latency p99, c=1 (ms) | {d['p99_ms']:.2f} | {g['p99_ms']:.2f} | {g['p99_ms'] - d['p99_ms']:+.2f} | |")
    print(f"| requests/s, c=32 | {d['rps32']:.0f} | {g['rps32']:.0f} | {ratio:.0%} of direct | >= {TARGET_RPS_RATIO:.0%} "
          f"{'met' if ratio >= TARGET_RPS_RATIO else 'MISSED'} |")
    print(f"| stream TTFT p50 (ms) | {ds['ttft_ms']:.2f} | {gs['ttft_ms']:.2f} | {gs['ttft_ms'] - ds['ttft_ms']:+.2f} | |")
    print(f"| stream first->last event p50 (ms, {args.tokens} events, itl {args.itl_ms} ms) | {ds['span_ms']:.1f} | "
          f"{gs['span_ms']:.1f} | {per_event:+.3f} per event | |")
    # A client descheduled for longer than one itl reads two events at once, direct or not; the
    # gateway coalesces nothing of its own if it shows no more such reads than the direct run
    # (within 0.1% of reads: one late read in a thousand is the scheduler, not the relay).
    added = gs["coalesced"] / gs["reads"] - ds["coalesced"] / ds["reads"]
    print(f"| socket reads carrying >1 event | {ds['coalesced']} of {ds['reads']} | {gs['coalesced']} of {gs['reads']} | "
          f"{added:+.2%} of reads | none added {'met' if added <= 0.001 else 'MISSED'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
