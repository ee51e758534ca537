"""The gateway's cost in front of a real engine: `enginegate bench` against a llama-server
directly and through the gateway relaying to that same llama-server, interleaved in one run.

    python benchmarks/gateway_fronting_llama_server.py [--concurrency 1,2,4] [--requests 12]

Needs the llama-server binary (`enginegate engines install llama-server`). Extra arguments after
`--` go to `enginegate bench` (e.g. `-- --json run.json --plot run.png`).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.llama_server import find_llama_server  # noqa: E402
from gateway.modelsource import embedded_model_path  # noqa: E402
from tests.gateway_process import REPO_ROOT, free_port, gateway  # noqa: E402

MODEL = "smollm2-135m-instruct"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,2,4")
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1, help="llama-server threads (leave a core to the gateway)")
    parser.add_argument("--parallel", type=int, default=4, help="llama-server slots")
    parser.add_argument("bench_args", nargs="*")
    args = parser.parse_args()

    binary = find_llama_server(None)
    if binary is None:
        print("llama-server not found: run `enginegate engines install llama-server`", file=sys.stderr)
        return 2
    port = free_port()
    engine = subprocess.Popen(
        [str(binary), "-m", str(embedded_model_path()), "--host", "127.0.0.1", "--port", str(port),
         "-a", MODEL, "-t", str(args.threads), "-np", str(args.parallel), "-c", str(4096 * args.parallel)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        for _ in range(600):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        config = (f"models:\n  - source: remote\n    name: {MODEL}\n    engine: openai\n"
                  f"    options: {{base_url: 'http://127.0.0.1:{port}'}}\n")
        with gateway(config_yaml=config) as gw:
            cmd = [sys.executable, "-m", "gateway", "bench", "--base-url", gw.base_url, "--name", "gateway",
                   "--compare", f"http://127.0.0.1:{port}/v1", "--compare-name", "llama-server",
                   "--model", MODEL, "--concurrency", args.concurrency, "--requests", str(args.requests),
                   "--input-tokens", "64", "--output-tokens", "32", "--slo-ttft-ms", "1000", "--slo-tpot-ms", "50",
                   *args.bench_args]
            return subprocess.run(cmd, cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}).returncode
    finally:
        os.killpg(engine.pid, signal.SIGTERM)
        engine.wait(timeout=30)


if __name__ == "__main__":
    raise SystemExit(main())
