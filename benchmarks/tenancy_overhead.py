"""What do keys and limits cost per request? The relay with tenancy off and, for each key store
(SQLite, Redis, PostgreSQL via `database_url`), a stored key without limits (`STORE-bare`) and one with
rpm, tpm, a concurrency cap and a token budget (`STORE-limits`, all far above the load), interleaved
round by round in one run. `static` is a config-file key (no store lookup, no limits).

    python -m benchmarks.tenancy_overhead [--requests 2000] [--rounds 3] [--before REV]

`--before REV` adds the keyed-with-limits variants of another revision (`git archive REV`, e.g. the
commit before this one) served from its own tree in the same interleaved run: before and after
measured on the same machine at the same time.

Upstream: the engine emulator on loopback (vLLM style, instant). Each variant is the real app
(`create_app`) under uvicorn (uvloop + httptools, one worker) relaying to it through the `openai`
adapter. `postgres` is a real PostgreSQL (Debian's, tests/postgres_server.py) on loopback, `redis`
a real redis-server. Reports p50 latency at concurrency 1 and requests/s at concurrency 32, each the
median of the rounds, the difference to tenancy off, and the targets (+0.2 ms p50, >= 85 % req/s).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from adapters import registry
from adapters.config import EngineConfig
from benchmarks.harness import BODY, REPO_ROOT, load, spawn, stop, wait_http
from tests.emulators.fixture import free_port

SECRET = "bench-secret-0123456789abcdef"
TARGET_ADDED_P50_MS = 0.2
TARGET_RPS_RATIO = 0.85
STORES = ("sqlite", "redis", "postgres")
VARIANTS = ("off", "static", *(f"{store}-{kind}" for store in STORES for kind in ("bare", "limits")))
LIMITS = {"rpm": 10**9, "tpm": 10**12, "max_concurrency": 10**6, "budget_tokens": 10**12}


def serve_gateway(port: int, upstream: str, variant: str, data: str, redis_url: str | None,
                  database_url: str | None) -> int:
    import uvicorn

    from gateway.app import create_app
    from gateway.config import Settings
    from gateway.routing import Admission, Backend, ModelRegistry
    from gateway.runtime import Runtime

    store, _, kind = variant.partition("-")
    models = ModelRegistry()
    config = EngineConfig(source="fast", name="fast", options={"base_url": upstream, "upstream_model": "emulated-model"})
    models.add(Backend(model_id="fast", adapter=registry.create("openai", config), admission=Admission(1024, 4096)))
    tenancy = {"path": Path(data) / "keys.sqlite3",  # each variant its own key store: its own prefix in the one redis
               **({"redis_url": redis_url, "redis_prefix": f"{variant}:"} if store == "redis" else {})}
    static = (SECRET,) if variant == "static" else ()
    database = {"database_url": database_url} if store == "postgres" else {}
    settings = Settings(port=port, tenancy=tenancy, api_keys=static, **database)
    if store in STORES:
        asyncio.run(_seed_key(settings, LIMITS if kind == "limits" else {}))
    app = create_app(settings, Runtime(settings=settings, models=models))
    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", log_level="warning",
                access_log=False, lifespan="on")
    return 0


async def _seed_key(settings: object, limits: dict[str, int]) -> None:
    from gateway.tenancy.keys import KeyPolicy, KeyRecord, hash_secret
    from gateway.tenancy.setup import open_database, open_store

    store = open_store(settings.tenancy, open_database(settings), owns_database=True)  # type: ignore[arg-type, attr-defined]
    try:
        await store.create(KeyRecord("bench", hash_secret(SECRET), KeyPolicy(**limits), 0.0))
    finally:
        await store.close()


def export_revision(rev: str, into: Path) -> Path:
    """The tree of `rev` (git archive), to serve the before variants from."""
    archive = subprocess.run(["git", "archive", rev], cwd=REPO_ROOT, check=True, capture_output=True).stdout
    into.mkdir()
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def spawn_in(root: Path, module_args: list[str]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.Popen([sys.executable, "-m", *module_args], cwd=root, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


async def measure(urls: dict[str, str], requests: int, rounds: int) -> dict[str, dict[str, float]]:
    body = {**BODY, "model": "fast"}
    auth = {"Authorization": f"Bearer {SECRET}"}
    p50: dict[str, list[float]] = {v: [] for v in urls}
    rps: dict[str, list[float]] = {v: [] for v in urls}
    for url in urls.values():
        await load(url, 8, 200, body, auth)  # warm-up
    for _ in range(rounds):
        for variant, url in urls.items():  # interleaved: the machine's noise falls on every variant alike
            p50[variant].append((await load(url, 1, max(200, requests // 4), body, auth)).p50_ms)
            rps[variant].append((await load(url, 32, requests, body, auth)).rps)
    return {v: {"p50_ms": statistics.median(p50[v]), "rps32": statistics.median(rps[v])} for v in urls}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--before", metavar="REV", help="also serve REV's keyed variants (with limits) in the same run")
    p.add_argument("--serve-gateway", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--upstream", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--redis-url", help=argparse.SUPPRESS)
    p.add_argument("--database-url", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_gateway:
        return serve_gateway(args.port, args.upstream, args.serve_gateway, args.data, args.redis_url, args.database_url)

    from tests.postgres_server import postgres_server
    from tests.redis_server import redis_server

    upstream_port = free_port()
    procs = [spawn(["tests.emulators.engine_emulator", "--style", "vllm", "--port", str(upstream_port), "--tokens", "16"])]
    with tempfile.TemporaryDirectory(prefix="enginegate-bench-") as data, redis_server(fsync_always=False) as redis, \
            postgres_server() as postgres:
        try:
            wait_http(f"http://127.0.0.1:{upstream_port}/health", procs[0])
            urls: dict[str, str] = {}
            gateways: list[tuple[str, Path, str]] = [(v, REPO_ROOT, v) for v in VARIANTS]
            if args.before:
                old = export_revision(args.before, Path(data) / "before")
                gateways += [(f"{store}-limits@before", old, f"{store}-limits") for store in STORES]
            for name, root, served in gateways:
                port = free_port()
                folder = Path(data) / name
                folder.mkdir()
                procs.append(spawn_in(root, ["benchmarks.tenancy_overhead", "--serve-gateway", served, "--port", str(port),
                                             "--upstream", f"http://127.0.0.1:{upstream_port}", "--data", str(folder),
                                             "--redis-url", redis.url, "--database-url", postgres.createdb(f"b{port}")]))
                wait_http(f"http://127.0.0.1:{port}/ready", procs[-1])
                urls[name] = f"http://127.0.0.1:{port}/v1/chat/completions"
            r = asyncio.run(measure(urls, args.requests, args.rounds))
        finally:
            for proc in reversed(procs):
                stop(proc)
    off = r["off"]
    print(f"| tenancy | p50 c=1 (ms) | added p50 | req/s c=32 | of off | targets (+{TARGET_ADDED_P50_MS} ms, "
          f">= {TARGET_RPS_RATIO:.0%}) |")
    print("|---|---|---|---|---|---|")
    for name, v in r.items():
        added, ratio = v["p50_ms"] - off["p50_ms"], v["rps32"] / off["rps32"]
        verdict = "" if name == "off" else (
            f"{'met' if added <= TARGET_ADDED_P50_MS else 'MISSED'} / {'met' if ratio >= TARGET_RPS_RATIO else 'MISSED'}")
        print(f"| {name} | {v['p50_ms']:.2f} | {added:+.2f} | {v['rps32']:.0f} | {ratio:.0%} | {verdict} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
