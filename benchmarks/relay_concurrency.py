"""The relay under many concurrent streams: the gateway in front of an external OpenAI-compatible URL
against that URL directly, at 32 and 128 streams, one run.

    python benchmarks/relay_concurrency.py [--concurrency 32,128] [--requests-per-stream 4] [--tokens 64]

Upstream: the engine emulator (vLLM style, one process, no slot limit), streaming `--tokens` tokens
`--itl-ms` apart after `--ttft-ms`. The gateway (`enginegate serve`, one process) serves it as
`engine: openai` with no admission settings of its own, so whatever cap it applies is its default
for an external URL. `enginegate bench --compare` drives both, level by level, interleaved, and
prints the ratios; this script then prints streams/s, output tokens/s and TTFT for each level, the
gateway's share of direct, and any refusals (429) by level.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import spawn, stop, wait_http  # noqa: E402
from tests.emulators.fixture import free_port  # noqa: E402
from tests.gateway_process import REPO_ROOT, gateway  # noqa: E402

MODEL = "relayed"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", default="32,128")
    p.add_argument("--requests-per-stream", type=int, default=4, help="requests per level = this x concurrency")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--itl-ms", type=float, default=5.0)
    p.add_argument("--ttft-ms", type=float, default=20.0)
    p.add_argument("--json", type=Path, help="write the bench's JSON here")
    args = p.parse_args()
    levels = [int(x) for x in args.concurrency.split(",") if x]

    port = free_port()
    upstream = spawn(["tests.emulators.engine_emulator", "--style", "vllm", "--port", str(port),
                      "--tokens", str(args.tokens), "--itl-ms", str(args.itl_ms), "--ttft-ms", str(args.ttft_ms)])
    try:
        wait_http(f"http://127.0.0.1:{port}/health", upstream)
        config = json.dumps({"models": [{"source": "remote", "name": MODEL, "engine": "openai", "options": {
            "base_url": f"http://127.0.0.1:{port}/v1", "upstream_model": "emulated-model"}}]})
        with gateway(config_yaml=config) as gw, tempfile.TemporaryDirectory(prefix="relay-concurrency-") as tmp:
            out = args.json or Path(tmp) / "bench.json"
            cmd = [sys.executable, "-m", "gateway", "bench", "--base-url", gw.base_url, "--name", "gateway",
                   "--model", MODEL, "--compare", f"http://127.0.0.1:{port}/v1", "--compare-name", "direct",
                   "--compare-model", "emulated-model", "--concurrency", args.concurrency,
                   "--requests", str(args.requests_per_stream * max(levels)), "--input-tokens", "16",
                   "--output-tokens", str(args.tokens), "--warmup", "8", "--no-progress", "--json", str(out)]
            done = subprocess.run(cmd, cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                                  capture_output=True, text=True)
            print(done.stdout)
            if done.returncode != 0:
                print(done.stderr[-3000:], file=sys.stderr)
                return done.returncode
            report = json.loads(out.read_text())
            slots = [line for line in gw.metrics().splitlines()
                     if line.startswith(("enginegate_generation_slots{", "enginegate_queue_capacity{"))]
    finally:
        stop(upstream)

    gateway_levels, direct_levels = report["results"]["gateway"], report["results"]["direct"]
    print(f"\nstreams of {args.tokens} tokens, {args.itl_ms:g} ms apart after {args.ttft_ms:g} ms; "
          f"{args.requests_per_stream * max(levels)} requests per level; gateway admission: {'; '.join(slots)}\n")
    print("| streams | gateway streams/s | direct streams/s | gateway / direct | output tok/s gateway / direct | "
          "TTFT p50 gateway / direct (ms) | gateway errors |")
    print("|---|---|---|---|---|---|---|")
    for g, d in zip(gateway_levels, direct_levels):
        errors = ", ".join(f"{k}: {v}" for k, v in g["errors"].items()) or "0"
        print(f"| {g['label'][2:]} | {g['request_rate']:.1f} | {d['request_rate']:.1f} | "
              f"{g['request_rate'] / d['request_rate']:.0%} | {g['output_tps'] / d['output_tps']:.0%} | "
              f"{g['ttft']['p50'] * 1000:.1f} / {d['ttft']['p50'] * 1000:.1f} | {errors} |")
    for w in report["warnings"]:
        print(f"warning: {w}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
