"""Does prefix affinity keep a conversation where its cache is? Two llama-server replicas of the
embedded model behind one gateway, multi-turn sessions, three routing policies, one run.

    python benchmarks/routing_affinity.py [--sessions 8] [--turns 6] [--prefix 1500] [--json out.json]

For each policy (round_robin, least_outstanding, least_outstanding + affinity: prefix) a fresh
gateway starts two llama-server replicas (`replicas: 2`, each `parallel` slots, the host's threads
split between them), then `enginegate bench --sessions` drives every session at once: each session
has its own ~`--prefix`-token system prompt and each turn carries the conversation so far. Every
policy sees the same conversations (one seed) on cold engines. Prints TTFT p50/p99, throughput and
TTFT per turn for each, how the gateway spread the requests, and the ratios affinity / least-outstanding.

`--engine-arg` passes a flag to both llama-servers (e.g. `--engine-arg=--cache-ram --engine-arg=0`
turns off llama-server's host-RAM prompt cache, which otherwise restores an evicted prefix).
Needs the llama-server binary (`enginegate engines install llama-server`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.llama_server import find_llama_server  # noqa: E402
from tests.gateway_process import REPO_ROOT, gateway  # noqa: E402

MODEL = "smollm"
POLICIES = {  # label -> routing block
    "round_robin": {"balance": "round_robin", "affinity": "none"},
    "least_outstanding": {"balance": "least_outstanding", "affinity": "none"},
    "prefix_affinity": {"balance": "least_outstanding", "affinity": "prefix"},
}
TARGET_TTFT_GAIN = 2.0


def config_yaml(routing: dict[str, str], parallel: int, context: int, engine_args: list[str]) -> str:
    options: dict[str, Any] = {"parallel": parallel, "context_length": context}
    if engine_args:
        options["extra_args"] = engine_args
    model = {"source": "default", "name": MODEL, "engine": "llama_server", "replicas": 2, "options": options,
             "routing": routing}
    return json.dumps({"models": [model]})  # JSON is YAML


def routed(metrics: str) -> dict[str, int]:
    """Requests per replica and reason, from the gateway's own counter."""
    out: dict[str, int] = {}
    pattern = r'^enginegate_routing_decisions_total\{([^}]*)\} ([0-9.e+]+)$'
    for labels, value in re.findall(pattern, metrics, re.M):
        pairs = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if float(value) and pairs.get("model") == MODEL:
            out[f"replica {pairs['replica']} ({pairs['reason']})"] = int(float(value))
    return out


def engine_prompt_tokens(metrics: str) -> float | None:
    """Prompt tokens the llama-servers computed, summed over both (llamacpp:prompt_tokens_total counts
    only evaluated tokens: a prefix served from the cache is not in it)."""
    match = re.search(r'^enginegate_engine_prompt_tokens\{[^}]*model="smollm"[^}]*\} ([0-9.e+]+)$', metrics, re.M)
    return float(match.group(1)) if match else None


def run_policy(label: str, args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    config = config_yaml(POLICIES[label], args.parallel, args.context, args.engine_arg)
    report = out_dir / f"{label}.json"
    with gateway(config_yaml=config, start_timeout=600) as gw:
        cmd = [sys.executable, "-m", "gateway", "bench", "--base-url", gw.base_url, "--model", MODEL,
               "--sessions", str(args.sessions), "--turns", str(args.turns),
               "--session-prefix-tokens", str(args.prefix), "--input-tokens", str(args.input_tokens),
               "--output-tokens", str(args.output_tokens), "--seed", str(args.seed), "--warmup", "0",
               "--no-ceiling", "--no-progress", "--timeout", "1800", "--json", str(report)]
        done = subprocess.run(cmd, cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"bench failed for {label}: {done.stderr[-3000:]}")
        metrics = httpx.get(f"{gw.url}/metrics", timeout=30).text
    data = json.loads(report.read_text())
    (level,) = data["results"]["A"]
    return {"level": level, "spread": routed(metrics), "computed": engine_prompt_tokens(metrics), "report": done.stdout}


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=8)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--prefix", type=int, default=1500, help="each session's system prompt, tokens")
    p.add_argument("--input-tokens", type=int, default=64, help="each turn's user message")
    p.add_argument("--output-tokens", type=int, default=32, help="each reply")
    p.add_argument("--parallel", type=int, default=4, help="slots per llama-server replica")
    p.add_argument("--context", type=int, default=16384, help="llama-server context (shared by its slots)")
    p.add_argument("--seed", type=int, default=15)
    p.add_argument("--policies", default=",".join(POLICIES), help="comma-separated subset of " + ", ".join(POLICIES))
    p.add_argument("--engine-arg", action="append", default=[], help="extra llama-server flag (repeat)")
    p.add_argument("--json", type=Path, help="write every policy's results here")
    args = p.parse_args()
    if find_llama_server(None) is None:
        print("llama-server not found: run `enginegate engines install llama-server`", file=sys.stderr)
        return 2
    chosen = [x for x in args.policies.split(",") if x]
    unknown = set(chosen) - set(POLICIES)
    if unknown:
        print(f"unknown policies {sorted(unknown)}", file=sys.stderr)
        return 2
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="routing-affinity-") as tmp:
        for label in chosen:
            print(f"running {label} ...", file=sys.stderr, flush=True)
            results[label] = run_policy(label, args, Path(tmp))

    print(f"\n{args.sessions} sessions x {args.turns} turns, ~{args.prefix}-token system prompt each, "
          f"{args.input_tokens}-token turns, {args.output_tokens}-token replies; 2 llama-server replicas x "
          f"{args.parallel} slots{' ' + ' '.join(args.engine_arg) if args.engine_arg else ''}\n")
    print("| policy | ok/sent | TTFT p50 ms | TTFT p99 ms | output tok/s | req/s | prompt tokens sent | "
          "computed by the engines | cached (usage) | requests per replica |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, r in results.items():
        s = r["level"]
        spread = ", ".join(f"{k}: {v}" for k, v in sorted(r["spread"].items()))
        computed = "-" if r["computed"] is None else f"{r['computed']:.0f}"
        cached = "-" if s.get("cached_fraction") is None else f"{s['cached_fraction']:.0%}"
        print(f"| {label} | {s['ok']}/{s['sent']} | {_ms(s['ttft']['p50'])} | {_ms(s['ttft']['p99'])} | "
              f"{s['output_tps']:.1f} | {s['request_rate']:.3f} | {s['prompt_tokens']} | {computed} | {cached} | "
              f"{spread} |")
    print("\nTTFT p50 per turn (ms):\n")
    turns = range(1, args.turns + 1)
    print("| policy | " + " | ".join(f"turn {t}" for t in turns) + " |")
    print("|---|" + "---|" * args.turns)
    for label, r in results.items():
        by_turn = {t["turn"]: t for t in r["level"]["turns"]}
        print(f"| {label} | " + " | ".join(_ms(by_turn[t]["ttft"]["p50"]) if t in by_turn else "-" for t in turns) + " |")
    if "prefix_affinity" in results and "least_outstanding" in results:
        a, lo = results["prefix_affinity"]["level"], results["least_outstanding"]["level"]
        gain = lo["ttft"]["p50"] / a["ttft"]["p50"] if a["ttft"]["p50"] else float("nan")
        tput = a["output_tps"] / lo["output_tps"] if lo["output_tps"] else float("nan")
        print(f"\nprefix affinity vs least-outstanding: TTFT p50 {gain:.2f}x better "
              f"(target >= {TARGET_TTFT_GAIN:.0f}x: {'met' if gain >= TARGET_TTFT_GAIN else 'missed'}), "
              f"TTFT p99 {lo['ttft']['p99'] / a['ttft']['p99']:.2f}x, output throughput {tput:.3f} "
              f"(target >= 1: {'met' if tput >= 1.0 else 'missed'})")
    if args.json:
        args.json.write_text(json.dumps({k: {key: v[key] for key in ("level", "spread", "computed")}
                                         for k, v in results.items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
