"""llama-server's host-RAM prompt cache on multi-turn sessions: prompt tokens computed with it on and off.

Two real llama-servers of the embedded model, identical but for `--cache-ram` (0, the plan's old choice for
every workload without shared prefixes, against a size), each with fewer slots than conversations in
flight, so a conversation's slot is taken by another between its turns. `enginegate bench --sessions`
runs the same seeded conversations against each in turn (interleaved round by round); the figure is the
prompt tokens the engine computed (`llamacpp:prompt_tokens_total` before and after, which counts only the
tokens it evaluated) against the least a perfect cache computes (the bench's `minimum`).

    python -m benchmarks.prompt_cache_sessions [--rounds 2] [--sessions 4] [--turns 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.llama_server import find_llama_server  # noqa: E402
from adapters.process import free_port  # noqa: E402
from benchmarks.harness import REPO_ROOT, stop, wait_http  # noqa: E402
from gateway.modelsource import embedded_model_path  # noqa: E402

PROMPT_COUNTER = re.compile(r"^llamacpp:prompt_tokens_total(?:\{[^}]*\})? ([0-9.e+]+)$", re.M)
MODEL = "smollm"


def computed_tokens(url: str) -> float:
    found = PROMPT_COUNTER.findall(httpx.get(f"{url}/metrics", timeout=30).text)
    if not found:
        raise RuntimeError("llama-server's /metrics has no llamacpp:prompt_tokens_total")
    return sum(float(v) for v in found)


@contextmanager
def llama_server(cache_ram_mib: int, args: argparse.Namespace, log: Path) -> Iterator[str]:
    binary = find_llama_server(None)
    if binary is None:
        raise SystemExit("llama-server not found: run `enginegate engines install llama-server`")
    port = free_port()
    argv = [str(binary), "-m", str(embedded_model_path()), "--host", "127.0.0.1", "--port", str(port),
            "--alias", MODEL, "-t", str(args.threads), "--parallel", str(args.slots), "-c", str(args.context),
            "--kv-unified", "--metrics", "--cache-ram", str(cache_ram_mib)]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/health", proc, timeout=300)
        while httpx.get(f"{url}/health", timeout=5).status_code != 200:  # 503 while loading
            time.sleep(0.2)
        yield url
    finally:
        stop(proc)


def bench(url: str, args: argparse.Namespace, seed: int, report: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "gateway", "bench", "--base-url", url, "--model", MODEL,
           "--sessions", str(args.sessions), "--turns", str(args.turns), "--session-prefix-tokens", str(args.prefix),
           "--input-tokens", str(args.input_tokens), "--output-tokens", str(args.output_tokens),
           "--seed", str(seed), "--warmup", "0", "--no-ceiling", "--no-progress", "--timeout", "900",
           "--json", str(report)]
    done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"bench failed ({done.returncode}): {done.stderr[-3000:]}")
    (level,) = json.loads(report.read_text())["results"]["A"]
    return level


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--sessions", type=int, default=4, help="conversations in flight at once")
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--slots", type=int, default=2, help="llama-server --parallel (fewer than --sessions)")
    p.add_argument("--prefix", type=int, default=400, help="each session's own system prompt, tokens")
    p.add_argument("--input-tokens", type=int, default=40)
    p.add_argument("--output-tokens", type=int, default=24)
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cache-ram-mib", type=int, default=1024, help="the 'on' variant's --cache-ram")
    p.add_argument("--json", type=Path, help="write every run here")
    args = p.parse_args(argv)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        variants = {size: stack.enter_context(llama_server(size, args, Path(tmp) / f"llama-server-{size}.log"))
                    for size in (0, args.cache_ram_mib)}
        for r in range(args.rounds):
            order = list(variants) if r % 2 == 0 else list(variants)[::-1]
            for size in order:
                url = variants[size]
                before = computed_tokens(url)
                started = time.monotonic()
                level = bench(url + "/v1", args, seed=1000 + r, report=Path(tmp) / f"{size}-{r}.json")
                work = level.get("prompt_work") or {}
                runs.append({"cache_ram_mib": size, "round": r, "computed": computed_tokens(url) - before,
                             "minimum": work.get("minimum"), "prompt_tokens": work.get("prompt_tokens"),
                             "computed_by_usage": work.get("computed"), "ttft_p50": level["ttft"]["p50"],
                             "ok": level["ok"], "sent": level["sent"], "wall_s": time.monotonic() - started})
                print(json.dumps({k: v for k, v in runs[-1].items()}), file=sys.stderr, flush=True)
    print(f"{args.sessions} sessions in flight on {args.slots} slots, {args.turns} turns, a {args.prefix}-token "
          f"system prompt each, {args.input_tokens}-token turns, {args.output_tokens}-token replies; "
          f"{args.rounds} rounds, interleaved\n")
    print("| --cache-ram | prompt tokens sent | computed (engine) | minimum | computed / minimum | TTFT p50 ms |")
    print("|---|---|---|---|---|---|")
    for size in (0, args.cache_ram_mib):
        mine = [x for x in runs if x["cache_ram_mib"] == size]
        sent = sum(x["prompt_tokens"] or 0 for x in mine)
        computed = sum(x["computed"] for x in mine)
        minimum = sum(x["minimum"] or 0 for x in mine)
        ttft = sorted(x["ttft_p50"] for x in mine)[len(mine) // 2] * 1000
        print(f"| {size} | {sent:.0f} | {computed:.0f} | {minimum:.0f} | "
              f"{computed / minimum if minimum else float('nan'):.2f}x | {ttft:.0f} |")
    off = sum(x["computed"] for x in runs if x["cache_ram_mib"] == 0)
    on = sum(x["computed"] for x in runs if x["cache_ram_mib"] == args.cache_ram_mib)
    print(f"\ncache on / off, prompt tokens computed: {on / off:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
