"""A flooded neighbour on an engine without preemption: llama-server with 2 slots (issue 38, item 1).

    python -m benchmarks.fairness [--floods 12,40] [--tokens 48] [--rounds 2] [--threads 1]

One llama-server process (the embedded SmolLM2, `--slots` slots, default 2) behind one gateway
(create_app in this process). For each flood size, each scheduler runs in the order
before, after, after, before (`--rounds 2`; 1: before, after), so a machine that drifts counts for
both; each run replaces the replica's admission while the gateway is idle (a fresh one: no flow in
its window), so every run meets the same engine process and the same gateway:

1. team-a alone: `N` streams of `--tokens` tokens at once; its tokens/s over its served streams;
2. team-b alone on the idle gateway: one short stream, its TTFT (team-b has now used the replica);
3. team-a's flood again, and team-b's request 0.5 s after it (then `--samples - 1` more, one after
   another): team-b's TTFT against step 2's, team-a's tokens/s against step 1's, team-a's 429s.

Schedulers: `before` is the gateway as it was (`newcomer_slots` kept none on 2 slots; one queue
of 16 for all flows: `scheduler: {newcomer_slots: 0, max_queue_per_flow: null}`, `max_queue: 16`);
`after` the defaults now (a kept slot on any replica of 2 or more; each flow's own queue of 64,
`max_queue` 256). The ratios are the figures: the machine is shared and its absolute speed drifts.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import dataclass

from benchmarks.scheduling import Gateway, Result, serving
from gateway.config import SchedulerConfig

SCHEDULERS: dict[str, tuple[SchedulerConfig, int]] = {
    "before": (SchedulerConfig(newcomer_slots=0, max_queue_per_flow=None), 16),
    "after": (SchedulerConfig(), 256),
}
FLOOD_PROMPT = "Write a long story about a lighthouse keeper."
NEIGHBOUR_PROMPT = "Say hello."


@dataclass
class Run:
    alone_rate: float
    alone_refused: int
    idle_ttft: float
    ttfts: list[float | None]
    statuses: list[int]
    rate: float
    refused: int


async def flood(gw: Gateway, n: int, tokens: int, neighbour: int = 0, spacing: float = 1.0) -> tuple[list[Result], float, list[Result]]:
    """team-a's `n` streams at once (and team-b's `neighbour` requests from 0.5 s on): team-a's results,
    its tokens/s over its served streams, team-b's results."""
    t0 = time.perf_counter()
    a = [asyncio.create_task(gw.chat("team-a", FLOOD_PROMPT, tokens)) for _ in range(n)]
    b: list[Result] = []
    if neighbour:
        await asyncio.sleep(0.5)
        for i in range(neighbour):
            if i:
                await asyncio.sleep(spacing)
            b.append(await gw.chat("team-b", NEIGHBOUR_PROMPT, 8))
    done = await asyncio.gather(*a)
    served = [r for r in done if r.status == 200]
    wall = max(r.seconds for r in served) if served else time.perf_counter() - t0
    return list(done), sum(r.tokens for r in served) / wall, b


async def one_run(gw: Gateway, scheduler: str, n: int, args: argparse.Namespace) -> Run:
    policy, queue = SCHEDULERS[scheduler]
    gw.use(policy, queue)
    alone, alone_rate, _ = await flood(gw, n, args.tokens)
    gw.use(policy, queue)  # a fresh window: team-a's run alone does not count as a flow seen
    idle = await gw.chat("team-b", NEIGHBOUR_PROMPT, 8)
    done, rate, b = await flood(gw, n, args.tokens, args.samples)
    run = Run(alone_rate, sum(r.status == 429 for r in alone), idle.ttft or float("nan"),
              [r.ttft for r in b], [r.status for r in b], rate, sum(r.status == 429 for r in done))
    print(f"  {n} streams, {scheduler}: team-b idle {run.idle_ttft:.3f} s, flooded {run.ttfts} {run.statuses}; "
          f"team-a {alone_rate:.1f} -> {rate:.1f} tokens/s, 429 {run.alone_refused} / {run.refused}",
          file=sys.stderr, flush=True)
    return run


def ratio(run: Run) -> float:
    """team-b's flooded TTFT (the median of its samples; a refused sample counts as infinite) / idle."""
    return statistics.median(t if t is not None else float("inf") for t in run.ttfts) / run.idle_ttft


async def bench(gw: Gateway, args: argparse.Namespace) -> None:
    order = ["before", "after", "after", "before"][: 2 * args.rounds] if args.rounds <= 2 else \
        ["before", "after"] * args.rounds
    results: dict[tuple[int, str], list[Run]] = {}
    for n in args.floods:
        for scheduler in order:
            results.setdefault((n, scheduler), []).append(await one_run(gw, scheduler, n, args))
    print(f"fairness: llama-server {args.slots} slots ({args.threads} thread(s)), team-a floods N streams of "
          f"{args.tokens} tokens, team-b sends one of 8 tokens 0.5 s later ({args.samples} in a row); "
          f"runs per row in the order {', '.join(order)}")
    print("| flood | scheduler | runs | team-b TTFT idle (s) | team-b TTFT flooded (s) | **ratio** | "
          "team-a tok/s alone | team-a tok/s with team-b | **ratio** | team-a 429 (of N) | team-b non-200 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (n, scheduler), runs in results.items():
        idle = "/".join(f"{r.idle_ttft:.2f}" for r in runs)
        flooded = "/".join(f"{statistics.median(t for t in r.ttfts if t is not None):.2f}"
                           if any(t is not None for t in r.ttfts) else "-" for r in runs)
        b_ratio = "/".join(f"{ratio(r):.1f}x" for r in runs)
        alone = "/".join(f"{r.alone_rate:.1f}" for r in runs)
        rate = "/".join(f"{r.rate:.1f}" for r in runs)
        a_ratio = "/".join(f"{r.rate / r.alone_rate:.0%}" for r in runs)
        refused = "/".join(str(r.refused) for r in runs)
        b_bad = "/".join(str(sum(s != 200 for s in r.statuses)) for r in runs)
        print(f"| {n} | {scheduler} | {len(runs)} | {idle} | {flooded} | {b_ratio} | {alone} | {rate} | {a_ratio} | "
              f"{refused} | {b_bad} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--floods", type=lambda s: [int(x) for x in s.split(",")], default=[12, 40])
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--samples", type=int, default=3, help="team-b's requests under each flood, one after another")
    p.add_argument("--rounds", type=int, default=2, help="1: before, after; 2: before, after, after, before")
    args = p.parse_args(argv)
    asyncio.run(serving(args.slots, args.threads, args.slots * 256, lambda gw: bench(gw, args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
