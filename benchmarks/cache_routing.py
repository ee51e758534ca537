"""Cache-aware routing against enginegate's other policies and sglang-router, on real llama-server replicas.

    python benchmarks/cache_routing.py [--quick] [--rounds 3] [--json out.json] [--markdown out.md]

Every variant runs two llama-server replicas of the embedded model, `--parallel` slots each, the host's
threads split between them (1 each on 2 cores), started cold for every run:

    round_robin, least_outstanding, prefix, session, cache   enginegate (`replicas: 2`, routing as named)
    sglang_router                                            sglang-router `--policy cache_aware` in front
                                                              of two llama-servers launched with the argv
                                                              the gateway's replicas ran (read from /proc)
    sglang_router_t0.7                                       the same with `--cache-threshold 0.7` (its
                                                              default 0.3 sends every session to the worker
                                                              that first held the shared system prompt)

Every variant gets the same explicit engine options, and the harness checks that the engines' command
lines really were the same (ports aside). `enginegate bench --sessions` drives the same seeded
conversations at each: open-loop session arrivals (`--arrival-rate`), think time between turns, one system
prompt shared by every session plus a document per session, more sessions than the 4 slots. Each variant
runs `--rounds` times, the order rotated per round. Reported per variant: TTFT p50/p90, output tok/s,
prompt tokens the engines computed (their own `llamacpp:prompt_tokens_total`, after minus before, so the
router's view does not enter) and the minimum a perfect cache needs; median and (min-max) over the runs;
TTFT gains vs least_outstanding and vs sglang-router. Then the closed-loop case of
benchmarks/routing_affinity.py (every session at once, each with its own system prompt) for cache vs
least_outstanding.

A variant this checkout lacks (the `cache` policy, or the open-loop flags of `enginegate bench`) stops the
run before anything starts, with what is missing; `--variants` picks a subset. sglang-router runs from its
own venv (`--sglang-python`; `scripts/engine_venvs.sh sglang-router` makes it).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.llama_server import find_llama_server  # noqa: E402
from adapters.process import free_port  # noqa: E402
from benchmarks.cache_routing_report import (  # noqa: E402
    LEAST_OUTSTANDING,
    ONE_GATEWAY,
    SGLANG,
    across_table,
    rotated,
    summarize,
    table,
)

SGLANG_TUNED = "sglang_router_t0.7"
SGLANG_ROUTERS: dict[str, list[str]] = {  # variant -> sglang-router flags beyond --policy cache_aware
    SGLANG: [],  # its defaults, as a user runs it
    # --cache-threshold above the share of a session's first prompt that the shared system prompt is here
    # (about 0.56): only a conversation's own later turns stick, new sessions go to the emptier tree
    SGLANG_TUNED: ["--cache-threshold", "0.7"],
}
from benchmarks.harness import stop, wait_http  # noqa: E402
from benchmarks.routing_affinity import engine_prompt_tokens  # noqa: E402
from tests.gateway_process import REPO_ROOT, gateway  # noqa: E402

MODEL = "smollm"
GATEWAY_ROUTING: dict[str, dict[str, str]] = {  # variant -> the model's routing block
    "round_robin": {"balance": "round_robin", "affinity": "none"},
    LEAST_OUTSTANDING: {"balance": "least_outstanding", "affinity": "none"},
    "prefix": {"balance": "least_outstanding", "affinity": "prefix"},
    "session": {"balance": "least_outstanding", "affinity": "session"},
    "cache": {"affinity": "cache"},
}
VARIANTS = (*GATEWAY_ROUTING, *SGLANG_ROUTERS)
ACROSS: dict[str, tuple[int, bool]] = {  # variant -> (gateways, routing.cache_peers on)
    ONE_GATEWAY: (1, False),
    "two_gateways": (2, True),
    "two_gateways_no_peers": (2, False),  # each gateway knows only what it placed (before cache_peers)
}
CLOSED_VARIANTS = ("cache", LEAST_OUTSTANDING)
OPEN_LOOP_FLAGS = ("--arrival-rate", "--think-seconds", "--document-tokens")
SGLANG_PYTHON = Path.home() / ".cache/enginegate/venvs/sglang-router/bin/python"
PROMPT_COUNTER = re.compile(r"^llamacpp:prompt_tokens_total(?:\{[^}]*\})? ([0-9.e+]+)$", re.M)
DECISIONS = re.compile(r'^enginegate_routing_decisions_total\{([^}]*)\} ([0-9.e+]+)$', re.M)


@dataclass(frozen=True)
class Workload:
    """One scenario's `enginegate bench --sessions` flags."""

    name: str  # "open" (arrivals over time) or "closed" (every session at once)
    sessions: int
    turns: int
    shared_prefix: int  # open: the system prompt every session shares; closed: each session's own
    document: int  # open: each session's own document (closed: 0)
    input_tokens: int
    output_tokens: int
    arrival_rate: float | None = None  # sessions per second (open only)
    think_seconds: float | None = None  # between a reply and the next turn (open only)

    def bench_args(self, bench_help: str) -> list[str]:
        """The flags for `enginegate bench`, whose --help is `bench_help`: before issue 25 a session's own
        system prompt was --shared-prefix-tokens, since then it is --session-prefix-tokens."""
        argv = ["--sessions", str(self.sessions), "--turns", str(self.turns), "--input-tokens", str(self.input_tokens),
                "--output-tokens", str(self.output_tokens)]
        if self.name == "open":
            return argv + ["--shared-prefix-tokens", str(self.shared_prefix), "--document-tokens", str(self.document),
                           "--arrival-rate", str(self.arrival_rate), "--think-seconds", str(self.think_seconds)]
        own = "--session-prefix-tokens" if "--session-prefix-tokens" in bench_help else "--shared-prefix-tokens"
        return argv + [own, str(self.shared_prefix)]

    def describe(self) -> str:
        if self.name == "open":
            return (f"open loop: {self.sessions} sessions arriving at {self.arrival_rate}/s, {self.turns} turns each, "
                    f"think time exponential with mean {self.think_seconds} s; one {self.shared_prefix}-token system prompt shared by all "
                    f"plus a {self.document}-token document per session; {self.input_tokens}-token turns, "
                    f"{self.output_tokens}-token replies")
        return (f"closed loop: {self.sessions} sessions all at once, {self.turns} turns each, each with its own "
                f"{self.shared_prefix}-token system prompt; {self.input_tokens}-token turns, {self.output_tokens}-token replies")


@dataclass(frozen=True)
class Engines:
    """What every variant's two llama-servers get."""

    parallel: int
    context: int
    threads: int
    cache_ram_mib: int
    extra: tuple[str, ...]

    def options(self) -> dict[str, Any]:
        return {"parallel": self.parallel, "context_length": self.context, "threads": self.threads,
                "cache_ram_mib": self.cache_ram_mib, "spec_type": "none", "extra_args": list(self.extra)}


def config_yaml(variant: str, engines: Engines, routing: dict[str, Any] | None = None) -> str:
    """The gateway's config for `variant`; `routing` adds settings to every variant's routing block."""
    model = {"source": "default", "name": MODEL, "engine": "llama_server", "replicas": 2,
             "options": engines.options(), "routing": {**GATEWAY_ROUTING[variant], **(routing or {})}}
    return json.dumps({"models": [model]})  # JSON is YAML


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- what this checkout and this host can run -------------------------------------------------------

def missing(variants: list[str], open_loop: bool, sglang_python: Path) -> list[str]:
    """Why some chosen variant or scenario cannot run here (empty: all can)."""
    problems = []
    if find_llama_server(None) is None:
        problems.append("llama-server not found: run `enginegate engines install llama-server`")
    if "cache" in variants:
        from pydantic import ValidationError  # noqa: PLC0415

        from gateway.config import RoutingConfig  # noqa: PLC0415

        try:
            RoutingConfig(**GATEWAY_ROUTING["cache"])
        except ValidationError:
            problems.append("variant cache: this checkout's gateway has no `routing.affinity: cache` "
                            "(the cache-aware policy of issue 25); leave it out with --variants")
    if open_loop:
        absent = [f for f in OPEN_LOOP_FLAGS if f not in bench_help()]
        if absent:
            problems.append(f"open loop: this checkout's `enginegate bench` has no {', '.join(absent)} "
                            "(issue 25's open-loop sessions); run --closed-only")
    if set(SGLANG_ROUTERS) & set(variants) and not sglang_python.exists():
        problems.append(f"variant {SGLANG}: no {sglang_python}: `scripts/engine_venvs.sh sglang-router` makes it "
                        "(or give --sglang-python)")
    return problems


@functools.cache
def bench_help() -> str:
    """This checkout's `enginegate bench --help`: which session flags it has."""
    return subprocess.run([sys.executable, "-m", "gateway", "bench", "--help"], cwd=REPO_ROOT, env=_env(),
                          capture_output=True, text=True, check=True).stdout


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT)}


# --- one run ---------------------------------------------------------------------------------------

def bench(url: str, workload: Workload, seed: int, report: Path, alternates: tuple[str, ...] = ()) -> dict[str, Any]:
    """`enginegate bench --sessions` against `url` (an OpenAI base URL; each session's turns alternate between it
    and `alternates`); returns its only level."""
    cmd = [sys.executable, "-m", "gateway", "bench", "--base-url", url, "--model", MODEL, *workload.bench_args(bench_help()),
           "--seed", str(seed), "--warmup", "0", "--no-ceiling", "--no-progress", "--timeout", "900",
           "--json", str(report), *(w for a in alternates for w in ("--alternate-url", a))]
    done = subprocess.run(cmd, cwd=REPO_ROOT, env=_env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"bench failed ({done.returncode}): {done.stderr[-3000:]}")
    (level,) = json.loads(report.read_text())["results"]["A"]
    return level


def prompt_work(level: dict[str, Any], key: str) -> float | None:
    """From the bench's `prompt_work` (issue 25): `minimum`, the prompt tokens a perfect cache computes (the
    shared system prompt once, each session's own text once, each later turn's new part), or `computed`,
    the same figure by the responses' usage (prompt - cached). None: this bench has none."""
    value = (level.get("prompt_work") or {}).get(key)
    return None if value is None else float(value)


def engine_argv(pid: int) -> list[str]:
    return [a for a in Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0") if a]


def normalized(argv: list[str]) -> list[str]:
    """The argv with its port blanked: what must match between variants."""
    out = list(argv)
    for i, word in enumerate(out[:-1]):
        if word == "--port":
            out[i + 1] = "PORT"
    return out


def _counter(pattern: re.Pattern[str], text: str) -> float:
    found = pattern.findall(text)
    if not found:
        raise RuntimeError(f"no {pattern.pattern!r} in the metrics")
    return sum(float(v) for v in found)


def _gateway_counter(metrics: str) -> float:
    """Both replicas' llamacpp:prompt_tokens_total, as the gateway reads them from the engines at each scrape."""
    value = engine_prompt_tokens(metrics)
    if value is None:
        raise RuntimeError("the gateway's /metrics has no enginegate_engine_prompt_tokens for the model")
    return value


def _decisions(metrics: str) -> dict[str, int]:
    """The gateway's own count of requests sent to each replica, by why it chose it ("r0 cache_hit": 12)."""
    out: dict[str, int] = {}
    for labels, value in DECISIONS.findall(metrics):
        pairs = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if float(value) and pairs.get("model") == MODEL:
            out[f"r{pairs['replica']} {pairs['reason']}"] = int(float(value))
    return out


def _per_replica(decisions: dict[str, int]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, n in decisions.items():
        replica = f"{key.split()[0]} requests"
        out[replica] = out.get(replica, 0.0) + n
    return out


def result(variant: str, level: dict[str, Any], computed: float, per_replica: dict[str, float],
           wall_s: float) -> dict[str, Any]:
    """One run's figures; `per_replica` is what the router's side shows per replica (the gateway: requests it
    sent each; sglang-router's workers: prompt tokens each computed)."""
    return {"variant": variant, "ttft_p50": level["ttft"]["p50"], "ttft_p90": level["ttft"]["p90"],
            "output_tps": level["output_tps"], "computed": computed, "minimum": prompt_work(level, "minimum"),
            "computed_by_usage": prompt_work(level, "computed"), "shared_tokens": prompt_work(level, "shared_tokens"),
            "ok": level["ok"], "sent": level["sent"], "cached_fraction": level.get("cached_fraction"),
            "per_replica": per_replica, "wall_s": wall_s, "level": level}


def run_gateway(variant: str, engines: Engines, routing: dict[str, Any], workload: Workload, seed: int,
                tmp: Path) -> tuple[dict[str, Any], list[list[str]]]:
    with gateway(config_yaml=config_yaml(variant, engines, routing), start_timeout=600) as gw:
        replicas = httpx.get(f"{gw.url}/admin/engines", timeout=30).json()[MODEL]["replicas"]
        argvs = [engine_argv(int(r["pid"])) for r in replicas]
        before = _gateway_counter(gw.metrics())
        started = time.monotonic()
        level = bench(gw.base_url, workload, seed, tmp / f"{variant}.json")
        wall = time.monotonic() - started
        metrics = gw.metrics()
        computed = _gateway_counter(metrics) - before
    decisions = _decisions(metrics)
    return result(variant, level, computed, _per_replica(decisions), wall) | {"decisions": decisions}, argvs


@contextmanager
def llama_servers(argv: list[str], count: int, tmp: Path) -> Iterator[list[str]]:
    """`count` llama-servers with `argv` (a gateway replica's), each on its own port; yields their URLs."""
    procs: list[subprocess.Popen[bytes]] = []
    urls = []
    try:
        for i in range(count):
            port = free_port()
            words = [str(port) if normalized(argv)[j] == "PORT" else w for j, w in enumerate(argv)]
            out = (tmp / f"llama-server-{i}.log").open("wb")
            procs.append(subprocess.Popen(words, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
            urls.append(f"http://127.0.0.1:{port}")
        for url, proc in zip(urls, procs):
            wait_http(f"{url}/health", proc, timeout=300)
            while httpx.get(f"{url}/health", timeout=5).status_code != 200:  # 503 while loading
                time.sleep(0.2)
        yield urls
    finally:
        for proc in procs:
            stop(proc)


@contextmanager
def sglang_router(python: Path, workers: list[str], extra: list[str], tmp: Path) -> Iterator[str]:
    port = free_port()
    cmd = [str(python), "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
           "--worker-urls", *workers, "--policy", "cache_aware", "--log-level", "warn", *extra]
    out = (tmp / "sglang-router.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:  # serving once both workers are registered (it lists them under the model "unknown")
            if proc.poll() is not None:
                raise RuntimeError(f"sglang-router exited {proc.returncode}: {(tmp / 'sglang-router.log').read_text()[-2000:]}")
            try:
                workers_seen = httpx.get(f"{url}/workers", timeout=2)
                if workers_seen.status_code == 200 and _healthy_workers(workers_seen.json()) >= len(workers):
                    break
            except (httpx.HTTPError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"sglang-router did not register {workers} in 120 s")
            time.sleep(0.2)
        yield url
    finally:
        stop(proc)


def _healthy_workers(listing: Any) -> int:
    items = listing.get("workers", []) if isinstance(listing, dict) else listing
    return sum(1 for w in items if isinstance(w, dict) and w.get("is_healthy", True))


def run_sglang(variant: str, python: Path, extra: list[str], argv: list[str], workload: Workload, seed: int,
               tmp: Path) -> dict[str, Any]:
    with llama_servers(argv, 2, tmp) as workers:
        before = [_counter(PROMPT_COUNTER, httpx.get(f"{w}/metrics", timeout=30).text) for w in workers]
        with sglang_router(python, workers, extra, tmp) as url:
            started = time.monotonic()
            level = bench(f"{url}/v1", workload, seed, tmp / f"{variant}.json")
            wall = time.monotonic() - started
        after = [_counter(PROMPT_COUNTER, httpx.get(f"{w}/metrics", timeout=30).text) for w in workers]
    per_replica = {f"r{i} computed": a - b for i, (a, b) in enumerate(zip(after, before))}
    return result(variant, level, sum(per_replica.values()), per_replica, wall)


# --- across gateways: two gateway processes in front of the same two llama-servers -------------------

def across_config(engines: Engines, urls: list[str], peers: str | None) -> str:
    """A gateway in front of the llama-servers at `urls` (`engine: openai` replicas capped at their slots, their load
    read from their metrics: every gateway's requests there),
    routing by cache; `peers`: the Redis URL of routing.cache_peers."""
    first, *others = [{"base_url": u, "max_concurrency": engines.parallel, "engine_metrics": "llama_server"} for u in urls]
    routing: dict[str, Any] = {"affinity": "cache", **({"cache_peers": peers} if peers else {})}
    return json.dumps({"models": [{"name": MODEL, "engine": "openai", "options": first, "routing": routing,
                                   "backends": [{"engine": "openai", "options": o} for o in others]}]})


def run_across(variant: str, engines: Engines, workload: Workload, seed: int, tmp: Path, redis_url: str) -> dict[str, Any]:
    """One run of an ACROSS variant on two cold llama-servers: prompt tokens they computed (their own counters)."""
    from tests.llama_servers import llama_servers  # noqa: PLC0415

    count, peers = ACROSS[variant]
    options = {"parallel": engines.parallel, "context_length": engines.context, "threads": engines.threads,
               "cache_ram_mib": engines.cache_ram_mib, "spec_type": "none", "extra_args": list(engines.extra)}
    with llama_servers(2, tmp, options, served=MODEL) as servers, contextlib.ExitStack() as stack:
        urls = [s.url for s in servers]
        gws = [stack.enter_context(gateway(config_yaml=across_config(engines, urls, redis_url if peers else None),
                                           start_timeout=600)) for _ in range(count)]
        if peers:
            _wait_listening(gws)
        before = [s.prompt_tokens_total() for s in servers]
        started = time.monotonic()
        level = bench(gws[0].base_url, workload, seed, tmp / f"{variant}.json", tuple(g.base_url for g in gws[1:]))
        wall = time.monotonic() - started
        after = [s.prompt_tokens_total() for s in servers]
        decisions = {f"gw{i} {k}": n for i, g in enumerate(gws) for k, n in _decisions(g.metrics()).items()}
        peer_counts = [httpx.get(f"{g.url}/v1/gateway/stats", timeout=10).json()["models"][MODEL].get("cache_peers")
                       for g in gws]
    per_replica = {f"r{i} computed": a - b for i, (a, b) in enumerate(zip(after, before))}
    return (result(variant, level, sum(per_replica.values()), per_replica, wall)
            | {"decisions": decisions, "cache_peers": [p for p in peer_counts if p]})


def _wait_listening(gws: list[Any]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = [httpx.get(f"{g.url}/v1/gateway/stats", timeout=10).json()["models"][MODEL].get("cache_peers") or {}
                 for g in gws]
        if all(f.get("listening") for f in found):
            return
        time.sleep(0.2)
    raise RuntimeError("the gateways did not subscribe to the cache peers' channel in 60 s")


def run_across_scenario(args: argparse.Namespace, engines: Engines, workload: Workload, tmp: Path) -> list[dict[str, Any]]:
    from tests.redis_server import redis_server  # noqa: PLC0415

    variants = [v for v in args.across_variants.split(",") if v]
    runs: list[dict[str, Any]] = []
    with redis_server(fsync_always=False) as redis:
        for round_index in range(args.rounds):
            for variant in rotated(variants, round_index):
                log(f"across gateways, round {round_index + 1}: {variant} ...")
                run_dir = Path(tempfile.mkdtemp(prefix=f"{variant}-", dir=tmp))
                try:
                    r = run_across(variant, engines, workload, args.seed, run_dir, redis.url)
                except Exception as exc:  # noqa: BLE001 - reported; the other variants still run
                    log(f"  {variant} FAILED: {type(exc).__name__}: {str(exc)[-1500:]}")
                    runs.append({"variant": variant, "round": round_index + 1, "error": f"{type(exc).__name__}: {exc}"})
                    continue
                r |= {"scenario": "across", "round": round_index + 1}
                log(f"  {variant}: {r['ok']}/{r['sent']} ok in {r['wall_s']:.0f} s, TTFT p50 {r['ttft_p50'] * 1000:.0f} ms, "
                    f"prompt tokens computed {r['computed']:.0f} (minimum {_count(r['minimum'])}), {r['per_replica']}, "
                    f"peers {r['cache_peers']}")
                runs.append(r)
    return runs


# --- the benchmark ---------------------------------------------------------------------------------

def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


class Runner:
    """Runs variants, keeps the reference engine argv (the first gateway's) and checks every later one."""

    def __init__(self, args: argparse.Namespace, engines: Engines, tmp: Path, variants: dict[str, list[str]],
                 versions: dict[str, str]) -> None:
        self.args, self.engines, self.tmp, self.variants, self.versions = args, engines, tmp, variants, versions
        self.started = time.monotonic()
        self.reference: list[str] | None = None
        self.differ: dict[str, list[str]] = {}  # variant -> its engines' argv, where not the reference's
        self.runs: list[dict[str, Any]] = []

    def reference_argv(self) -> list[str]:
        if self.reference is None:  # sglang ran before any gateway: start one only to read its replicas' argv
            log("reading the replicas' llama-server argv from a gateway (for sglang-router's workers) ...")
            with gateway(config_yaml=config_yaml(LEAST_OUTSTANDING, self.engines), start_timeout=600) as gw:
                replicas = httpx.get(f"{gw.url}/admin/engines", timeout=30).json()[MODEL]["replicas"]
                self._check([engine_argv(int(r["pid"])) for r in replicas], "probe")
        assert self.reference is not None
        return self.reference

    def _check(self, argvs: list[list[str]], variant: str) -> None:
        for argv in argvs:
            if self.reference is None:
                self.reference = argv
                log("engines: " + " ".join(normalized(argv)))
            elif normalized(argv) != normalized(self.reference) and variant not in self.differ:
                self.differ[variant] = normalized(argv)  # reported with the table: its runs are not comparable
                log(f"WARNING: {variant}'s engines differ from the first variant's: {' '.join(normalized(argv))}")

    def run(self, variant: str, workload: Workload, round_index: int, position: str) -> dict[str, Any]:
        log(f"{workload.name} round {round_index + 1} {position}: {variant} ...")
        run_dir = Path(tempfile.mkdtemp(prefix=f"{variant}-", dir=self.tmp))
        where = {"scenario": workload.name, "round": round_index + 1}
        try:
            if variant in SGLANG_ROUTERS:
                r = run_sglang(variant, self.args.sglang_python, SGLANG_ROUTERS[variant] + self.args.sglang_arg,
                               self.reference_argv(), workload, self.args.seed, run_dir)
            else:
                r, argvs = run_gateway(variant, self.engines, self.args.routing, workload, self.args.seed, run_dir)
                self._check(argvs, variant)
        except Exception as exc:  # noqa: BLE001 - one failed run is reported, the other variants still run
            log(f"  {variant} FAILED: {type(exc).__name__}: {str(exc)[-1500:]}")
            failed = {"variant": variant, **where, "error": f"{type(exc).__name__}: {str(exc)[-3000:]}"}
            self.runs.append(failed)
            self.save()
            return failed
        r |= where
        minimum = _count(r["minimum"])
        log(f"  {variant}: {r['ok']}/{r['sent']} ok in {r['wall_s']:.0f} s, TTFT p50 {r['ttft_p50'] * 1000:.0f} ms "
            f"p90 {r['ttft_p90'] * 1000:.0f} ms, {r['output_tps']:.1f} output tok/s, prompt tokens computed "
            f"{r['computed']:.0f} (minimum {minimum}; by usage {_count(r['computed_by_usage'])}), "
            f"per replica {r['per_replica']}" + (f" {r['decisions']}" if r.get("decisions") else ""))
        self.runs.append(r)
        self.save()
        return r

    def document(self, summary: dict[str, Any] | None = None) -> dict[str, Any]:
        """Everything measured so far, as --json writes it and `render` reads it."""
        open_w, closed_w = workloads(self.args)
        return {"argv": sys.argv[1:], "engines": asdict(self.engines), "routing_options": self.args.routing,
                "sglang_args": self.args.sglang_arg, "engine_argv": self.reference, "engine_argv_differs": self.differ,
                "versions": self.versions, "seed": self.args.seed, "variants": self.variants,
                "workloads": {"open": asdict(open_w), "closed": asdict(closed_w)},
                "elapsed_s": round(time.monotonic() - self.started), "runs": self.runs, "summary": summary}

    def save(self, summary: dict[str, Any] | None = None) -> None:
        """Every run so far to --json (after each run, so a run cut short keeps what it measured)."""
        if self.args.json is not None:
            self.args.json.write_text(json.dumps(self.document(summary), indent=1))

    def scenario(self, workload: Workload, variants: list[str], rounds: int) -> list[dict[str, Any]]:
        runs = []
        for round_index in range(rounds):
            order = rotated(variants, round_index)
            for i, variant in enumerate(order):
                runs.append(self.run(variant, workload, round_index, f"{i + 1}/{len(order)}"))
        return runs


def workloads(args: argparse.Namespace) -> tuple[Workload, Workload]:
    if args.quick:
        return (Workload("open", 6, 2, 200, 150, 24, 12, arrival_rate=0.5, think_seconds=1.0),
                Workload("closed", 4, 2, 300, 0, 24, 12))
    return (Workload("open", args.sessions, args.turns, args.shared_prefix, args.document, args.input_tokens,
                     args.output_tokens, arrival_rate=args.arrival_rate, think_seconds=args.think_seconds),
            Workload("closed", args.closed_sessions, args.closed_turns, args.closed_prefix, 0, args.input_tokens,
                     args.output_tokens))


def versions(python: Path, with_sglang: bool) -> dict[str, str]:
    binary = find_llama_server(None)
    out = {"llama-server": "?", "host": f"{platform.node()} {os.cpu_count()} CPUs"}
    if binary is not None:
        done = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
        out["llama-server"] = next((line for line in (done.stdout + done.stderr).splitlines() if "version" in line), "?")
    if with_sglang and python.exists():
        done = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('sglang-router'))"],
                              capture_output=True, text=True)
        out["sglang-router"] = done.stdout.strip() or "?"
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke run: a tiny workload, one round")
    p.add_argument("--rounds", type=int, default=None, help="runs per variant, order rotated per round (default 3; --quick 1)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ", ".join(VARIANTS))
    p.add_argument("--closed-only", action="store_true", help="only the closed-loop case")
    p.add_argument("--no-closed", dest="closed", action="store_false", help="skip the closed-loop case")
    p.add_argument("--closed-rounds", type=int, default=None, help="closed-loop runs per variant (default: --rounds)")
    p.add_argument("--closed-variants", default=",".join(CLOSED_VARIANTS), help="variants of the closed-loop case")
    p.add_argument("--across-gateways", action="store_true",
                   help="only the case of two gateway processes in front of the same two llama-servers (the open-loop "
                        "workload, each session's turns alternating between the gateways) against one gateway")
    p.add_argument("--across-variants", default=",".join(ACROSS), help="variants of --across-gateways: " + ", ".join(ACROSS))
    w = p.add_argument_group("open-loop workload")
    w.add_argument("--sessions", type=int, default=10)
    w.add_argument("--turns", type=int, default=4)
    w.add_argument("--arrival-rate", type=float, default=0.2, help="sessions per second")
    w.add_argument("--think-seconds", type=float, default=3.0, help="mean think time between turns")
    w.add_argument("--shared-prefix", type=int, default=300, help="system prompt every session shares, tokens")
    w.add_argument("--document", type=int, default=200, help="each session's document, tokens")
    w.add_argument("--input-tokens", type=int, default=32, help="each turn's user message")
    w.add_argument("--output-tokens", type=int, default=16, help="each reply")
    c = p.add_argument_group("closed-loop workload (benchmarks/routing_affinity.py's shape: every session at once, "
                             "one per slot, each with its own system prompt)")
    c.add_argument("--closed-sessions", type=int, default=4)
    c.add_argument("--closed-turns", type=int, default=4)
    c.add_argument("--closed-prefix", type=int, default=600, help="each session's own system prompt, tokens")
    e = p.add_argument_group("engines (the same for every variant)")
    e.add_argument("--parallel", type=int, default=2, help="slots per llama-server")
    e.add_argument("--context", type=int, default=8192, help="KV cells per llama-server (shared by its slots)")
    e.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2), help="threads per llama-server")
    e.add_argument("--cache-ram-mib", type=int, default=0,
                   help="llama-server --cache-ram (host-RAM prompt cache; 0, the plan's choice here, turns it off)")
    e.add_argument("--engine-arg", action="append", default=None,
                   help="llama-server flag for every replica (repeat; default: --kv-unified, as the plan launches it)")
    p.add_argument("--routing-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a routing setting for every gateway variant, e.g. load_factor=1.5 (repeat; value as YAML)")
    p.add_argument("--seed", type=int, default=25)
    p.add_argument("--sglang-python", type=Path, default=SGLANG_PYTHON, help="python of sglang-router's venv")
    p.add_argument("--sglang-arg", action="append", default=[],
                   help="extra sglang-router flag for its variants (repeat; sglang_router otherwise runs its "
                        "cache_aware defaults, as a user runs it)")
    p.add_argument("--json", type=Path, help="write every run and the summary here")
    p.add_argument("--markdown", type=Path, help="write the tables here")
    p.add_argument("--from-json", type=Path, metavar="FILE",
                   help="run nothing: print (and --markdown) the tables of a --json file, finished or cut short")
    args = p.parse_args(argv)
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    if args.closed_rounds is None:
        args.closed_rounds = args.rounds
    if args.engine_arg is None:
        args.engine_arg = ["--kv-unified"]
    args.routing = {}
    for item in args.routing_option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            p.error(f"--routing-option wants KEY=VALUE, not {item!r}")
        args.routing[key] = yaml.safe_load(value)
    return args


def report(title: str, runs: list[dict[str, Any]], order: list[str]) -> str:
    peers = [LEAST_OUTSTANDING, *(v for v in SGLANG_ROUTERS if v in order)]

    def split(r: dict[str, Any]) -> str:
        return "failed" if "error" in r else ", ".join(f"{k} {n:.0f}" for k, n in sorted(r["per_replica"].items()))

    spread = [f"- {v}: " + "; ".join(split(r) for r in runs if r["variant"] == v) for v in order]
    return (f"{title}\n\n{table(summarize(runs), order, peers)}\n\nPer replica, run by run (the gateway: requests it sent "
            "each; sglang-router: prompt tokens each of its workers computed):\n\n" + "\n".join(spread) + "\n")


def render(doc: dict[str, Any]) -> str:
    """The tables of a --json document (a finished benchmark, or one cut short)."""
    e = doc["engines"]
    engines_line = " ".join(normalized(doc["engine_argv"] or []))
    text = (f"2 llama-server replicas x {e['parallel']} slots, {e['threads']} thread(s) each, cold for every run; "
            f"engines: `{engines_line}`; versions: {doc['versions']}; seed {doc['seed']}; {doc['elapsed_s']} s in all"
            + (f"; routing settings added to every gateway variant: {doc['routing_options']}"
               if doc["routing_options"] else "") + "\n")
    for variant, argv in doc["engine_argv_differs"].items():
        text += f"\n**{variant} ran other engines** (not comparable): `{' '.join(argv)}`\n"
    for name, order in doc["variants"].items():
        runs = [r for r in doc["runs"] if r["scenario"] == name]
        if runs:
            rounds = max(r["round"] for r in runs)
            text += "\n" + report(f"{Workload(**doc['workloads'][name]).describe()}; {rounds} round(s), the order of "
                                  "the variants rotated per round:", runs, order)
    shared = max((r.get("shared_tokens") or 0 for r in doc["runs"]), default=0)
    text += ("\n`prompt tokens computed`: both engines' own `llamacpp:prompt_tokens_total`, after the run minus before "
             "(for the gateway as it relays them, `enginegate_engine_prompt_tokens`). `minimum`: `enginegate bench`'s "
             "perfect-cache count: the shared system prompt once, each session's own text once, then each later "
             "turn's new part" + (f"; two replicas each compute the shared prompt once, so their floor is "
                                  f"{shared:.0f} tokens above it" if shared else "") + ".\n")
    return text


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json:
        text = render(json.loads(args.from_json.read_text()))
        print(text)
        if args.markdown:
            args.markdown.write_text(text)
        return 0
    if args.across_gateways:
        return main_across(args)
    chosen = [v for v in args.variants.split(",") if v]
    closed_chosen = [v for v in args.closed_variants.split(",") if v]
    unknown = sorted(set(chosen + closed_chosen) - set(VARIANTS))
    if unknown:
        print(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    open_variants = [] if args.closed_only else chosen
    closed_variants = closed_chosen if (args.closed or args.closed_only) else []
    problems = missing(sorted(set(open_variants) | set(closed_variants)), bool(open_variants), args.sglang_python)
    if problems:
        print("cannot run:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    engines = Engines(args.parallel, args.context, args.threads, args.cache_ram_mib, tuple(args.engine_arg))
    open_w, closed_w = workloads(args)
    found = versions(args.sglang_python, bool(set(SGLANG_ROUTERS) & set(open_variants + closed_variants)))
    with tempfile.TemporaryDirectory(prefix="cache-routing-") as tmp:
        runner = Runner(args, engines, Path(tmp), {"open": open_variants, "closed": closed_variants}, found)
        open_runs = runner.scenario(open_w, open_variants, args.rounds) if open_variants else []
        closed_runs = runner.scenario(closed_w, closed_variants, args.closed_rounds) if closed_variants else []
    summary = {name: {v: {m: None if s is None else asdict(s) for m, s in ms.items()} for v, ms in summarize(rs).items()}
               for name, rs in (("open", open_runs), ("closed", closed_runs)) if rs}
    runner.save(summary)
    text = render(runner.document(summary))
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    return 1 if any("error" in r for r in runner.runs) else 0


def main_across(args: argparse.Namespace) -> int:
    unknown = sorted(set(v for v in args.across_variants.split(",") if v) - set(ACROSS))
    if unknown or find_llama_server(None) is None:
        print(f"cannot run: unknown variants {unknown}" if unknown else "cannot run: llama-server not found",
              file=sys.stderr)
        return 2
    engines = Engines(args.parallel, args.context, args.threads, args.cache_ram_mib, tuple(args.engine_arg))
    open_w, _ = workloads(args)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cache-routing-across-") as tmp:
        runs = run_across_scenario(args, engines, open_w, Path(tmp))
    text = (f"Across gateways: two cold llama-servers x {engines.parallel} slots, {engines.threads} thread(s) each, as "
            f"`engine: openai` replicas (max_concurrency {engines.parallel}) of every gateway; {open_w.describe()}; each "
            f"session's turns alternate between the gateways; seed {args.seed}; {time.monotonic() - started:.0f} s in all.\n\n"
            + across_table(runs) + "\n")
    print(text)
    if args.json is not None:
        args.json.write_text(json.dumps({"argv": sys.argv[1:], "engines": asdict(engines), "workload": asdict(open_w),
                                         "runs": runs}, indent=1))
    if args.markdown:
        args.markdown.write_text(text)
    return 1 if any("error" in r for r in runs) else 0


if __name__ == "__main__":
    raise SystemExit(main())
