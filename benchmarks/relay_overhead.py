"""What does the gateway add on top of an engine? Direct vs through `create_app`, one run.

    python -m benchmarks.relay_overhead [--requests 3000] [--rounds 3] [--streams 40] [--baseline DIR]

Upstream: the engine emulator on loopback (vLLM style): one instant (16 tokens, streamed or
not, no pacing), one paced (one token per --itl-ms) for the timing of streamed events. The
gateway is the real app (`gateway.app.create_app`) in the real server (`gateway.server.build_server`:
uvicorn, uvloop + httptools, ONE worker, log level warning), pinned to one core (--gateway-cpu),
serving both emulators through the `openai` (external) adapter, i.e. the relay in adapters/openai_http.py.

Each round measures, direct then through the gateway (interleaved, so the machine's noise hits
both alike): latency at concurrency 1, requests/s at concurrency 32 without streaming and with
streaming (16-token streams), and the serving process's CPU time per request at c=1 and c=32 (the
emulator's for direct, the gateway's through it): at c=32 what bounds the gateway on a busy machine,
at c=1 most of the latency it adds (every wakeup and system call paid by one request). Ratios are
the medians over the rounds of each round's ratio. Then, once: added time to first token, added
delay per event and whether any two events reached the client coalesced, on the paced upstream.

`--baseline DIR` serves a second gateway from another checkout of the repository (say a
`git worktree add /tmp/base <commit>`), measured in the same rounds: before and after in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness import BODY, REPO_ROOT, load, median_ms, spawn, stop, stream_load, wait_http
from tests.emulators.fixture import free_port

TARGET_ADDED_P50_MS = 0.5
TARGET_RPS_RATIO = 0.30
TARGET_STREAM_RPS_RATIO = 0.60
FAST_TOKENS = 16


def serve_gateway(port: int, fast: str, paced: str, cpu: int | None) -> int:
    from adapters import registry
    from adapters.config import EngineConfig
    from gateway.app import create_app
    from gateway.config import Settings
    from gateway.routing import Admission, Backend, ModelRegistry
    from gateway.runtime import Runtime
    from gateway.server import build_server

    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    models = ModelRegistry()
    for name, url in (("fast", fast), ("paced", paced)):
        config = EngineConfig(source=name, name=name, options={"base_url": url, "upstream_model": "emulated-model"})
        models.add(Backend(model_id=name, adapter=registry.create("openai", config), admission=Admission(1024, 4096)))
    settings = Settings(port=port, log_level="warning")
    app = create_app(settings, Runtime(settings=settings, models=models))
    build_server(app, settings).run()
    return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Target:
    name: str
    url: str
    model: str
    stream_model: str
    pid: int
    """The process that serves it (its CPU time is counted)."""
    rounds: list[dict[str, float]] = field(default_factory=list)


async def measure(t: Target, requests: int) -> dict[str, float]:
    body = {**BODY, "model": t.model, "max_tokens": FAST_TOKENS}
    streamed = {**body, "stream": True}
    await load(t.url, 8, 200, body)  # warm-up: connections, caches
    await load(t.url, 8, 100, streamed)
    c1_requests = max(300, requests // 3)
    start = cpu_seconds(t.pid)
    c1 = await load(t.url, 1, c1_requests, body)
    before = cpu_seconds(t.pid)
    c32 = await load(t.url, 32, requests, body)
    mid = cpu_seconds(t.pid)
    s32 = await load(t.url, 32, requests // 2, streamed)
    after = cpu_seconds(t.pid)
    return {"p50_ms": c1.p50_ms, "p99_ms": c1.p99_ms, "rps32": c32.rps, "stream_rps32": s32.rps,
            "cpu_us": (mid - before) / requests * 1e6, "stream_cpu_us": (after - mid) / (requests // 2) * 1e6,
            "c1_cpu_us": (before - start) / c1_requests * 1e6}


def _gateway(tree: Path, port: int, fast: str, paced: str, cpu: int | None) -> subprocess.Popen[bytes]:
    """This script's server, importing the gateway from `tree` (this checkout or a baseline)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--serve-gateway", "--port", str(port), "--fast", fast,
           "--paced", paced, "--gateway-cpu", "none" if cpu is None else str(cpu)]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)


def _default_cpu() -> str:
    cpus = sorted(os.sched_getaffinity(0))
    return str(cpus[-1]) if len(cpus) > 1 else "none"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=3000, help="requests per level and round (streams: half)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--streams", type=int, default=40, help="sequential paced streams for the event timings")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--itl-ms", type=float, default=5.0)
    p.add_argument("--gateway-cpu", default=_default_cpu(), help="the core the gateway is pinned to, or 'none'")
    p.add_argument("--baseline", type=Path, help="also serve a gateway from this checkout (before/after in one run)")
    p.add_argument("--serve-gateway", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--fast", help=argparse.SUPPRESS)
    p.add_argument("--paced", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    cpu = None if args.gateway_cpu == "none" else int(args.gateway_cpu)
    if args.serve_gateway:
        return serve_gateway(args.port, args.fast, args.paced, cpu)

    fast_port, paced_port = free_port(), free_port()
    procs = [
        spawn(["tests.emulators.engine_emulator", "--style", "vllm", "--port", str(fast_port), "--tokens", str(FAST_TOKENS)]),
        spawn(["tests.emulators.engine_emulator", "--style", "vllm", "--port", str(paced_port),
               "--tokens", str(args.tokens), "--itl-ms", str(args.itl_ms)]),
    ]
    fast, paced = f"http://127.0.0.1:{fast_port}", f"http://127.0.0.1:{paced_port}"
    path = "/v1/chat/completions"
    try:
        wait_http(f"{fast}/health", procs[0])
        wait_http(f"{paced}/health", procs[1])
        targets = [Target("direct", fast + path, "emulated-model", "emulated-model", procs[0].pid)]
        trees = [("gateway", REPO_ROOT)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
        for name, tree in trees:
            port = free_port()
            procs.append(_gateway(tree, port, fast, paced, cpu))
            wait_http(f"http://127.0.0.1:{port}/ready", procs[-1])
            targets.append(Target(name, f"http://127.0.0.1:{port}{path}", "fast", "paced", procs[-1].pid))
        for r in range(args.rounds):
            for t in targets:
                t.rounds.append(asyncio.run(measure(t, args.requests)))
            print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                f"{t.name} {t.rounds[-1]['rps32']:.0f} req/s {t.rounds[-1]['stream_rps32']:.0f} streams/s" for t in targets),
                file=sys.stderr, flush=True)
        streams = {}
        for t in targets:
            url = paced + path if t.name == "direct" else t.url
            streams[t.name] = asyncio.run(stream_load(url, args.streams, args.tokens, model=t.stream_model))
    finally:
        for proc in reversed(procs):
            stop(proc)
    report(targets, streams, args)
    return 0


def _median(values: list[float]) -> float:
    return statistics.median(values)


def report(targets: list[Target], streams: dict[str, Any], args: argparse.Namespace) -> None:
    direct, relays = targets[0], targets[1:]

    def per_round(t: Target, fn: Callable[[dict[str, float], dict[str, float]], float]) -> float:
        return _median([fn(g, d) for g, d in zip(t.rounds, direct.rounds)])

    def med(t: Target, key: str) -> float:
        return _median([r[key] for r in t.rounds])

    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    names = " | ".join(f"through {t.name}" for t in relays)
    print(f"pinned to core {args.gateway_cpu}; {args.rounds} rounds of {args.requests} requests "
          f"({args.requests // 2} streams of {FAST_TOKENS} tokens) per level; medians over rounds\n")
    print(f"| measure | direct | {names} | target |")
    print("|---|---|" + "---|" * len(relays) + "---|")
    cells = [f"{med(t, 'p50_ms'):.2f} ({per_round(t, lambda g, d: g['p50_ms'] - d['p50_ms']):+.2f})" for t in relays]
    added = per_round(relays[0], lambda g, d: g["p50_ms"] - d["p50_ms"])
    print(f"| latency p50, c=1 (ms; added) | {med(direct, 'p50_ms'):.2f} | {' | '.join(cells)} | "
          f"<= +{TARGET_ADDED_P50_MS} {verdict(added <= TARGET_ADDED_P50_MS)} |")
    cells = [f"{med(t, 'p99_ms'):.2f} ({per_round(t, lambda g, d: g['p99_ms'] - d['p99_ms']):+.2f})" for t in relays]
    print(f"| latency p99, c=1 (ms; added) | {med(direct, 'p99_ms'):.2f} | {' | '.join(cells)} | |")
    for key, label, target in (("rps32", "requests/s, c=32", TARGET_RPS_RATIO),
                               ("stream_rps32", f"streams/s, c=32 ({FAST_TOKENS} tokens)", TARGET_STREAM_RPS_RATIO)):
        ratio = per_round(relays[0], lambda g, d, k=key: g[k] / d[k])
        cells = [f"{med(t, key):.0f} ({per_round(t, lambda g, d, k=key: g[k] / d[k]):.0%} of direct)" for t in relays]
        print(f"| {label} | {med(direct, key):.0f} | {' | '.join(cells)} | >= {target:.0%} {verdict(ratio >= target)} |")
    for key, label in (("c1_cpu_us", "CPU per request, c=1 (us; x direct)"), ("cpu_us", "CPU per request (us; x direct)"),
                       ("stream_cpu_us", "CPU per stream (us; x direct)")):
        cells = [f"{med(t, key):.0f} ({per_round(t, lambda g, d, k=key: g[k] / d[k]):.1f}x)" for t in relays]
        print(f"| {label} | {med(direct, key):.0f} | {' | '.join(cells)} | |")
    ds = streams["direct"]
    ttft = [f"{median_ms(streams[t.name].ttfts):.2f} ({median_ms(streams[t.name].ttfts) - median_ms(ds.ttfts):+.2f})"
            for t in relays]
    print(f"| paced stream TTFT p50 (ms; added) | {median_ms(ds.ttfts):.2f} | {' | '.join(ttft)} | |")
    per_event = [f"{median_ms(streams[t.name].spans):.1f} "
                 f"({(median_ms(streams[t.name].spans) - median_ms(ds.spans)) / max(args.tokens - 1, 1):+.3f} per event)"
                 for t in relays]
    print(f"| paced first->last event p50 (ms, {args.tokens} events, itl {args.itl_ms} ms) | {median_ms(ds.spans):.1f} | "
          f"{' | '.join(per_event)} | |")
    # A client descheduled for longer than one itl reads two events at once, direct or not; the
    # gateway coalesces nothing of its own if it shows no more such reads than the direct run
    # (within 0.1% of reads: one late read in a thousand is the scheduler, not the relay).
    base = ds.reads_with_several_events / ds.reads
    coalesced = [streams[t.name].reads_with_several_events / streams[t.name].reads - base for t in relays]
    cells = [f"{streams[t.name].reads_with_several_events} of {streams[t.name].reads} ({c:+.2%})"
             for t, c in zip(relays, coalesced)]
    print(f"| paced socket reads carrying >1 event | {ds.reads_with_several_events} of {ds.reads} | {' | '.join(cells)} | "
          f"none added {verdict(coalesced[0] <= 0.001)} |")


if __name__ == "__main__":
    sys.exit(main())
