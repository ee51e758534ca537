"""A flooded neighbour, on llama-server with 2 slots and on the vLLM and SGLang emulators (issue 38, item 1),
in one run.

    python -m benchmarks.fairness [--engines llama_server,vllm,sglang] [--floods 12,40] [--tokens 48]
                                  [--rounds 2] [--threads 1] [--baseline before[,kept|unkept]] [--prompt-cache]

For each engine, one engine process behind one gateway (create_app in this process): llama-server (the
embedded SmolLM2, `--slots` slots, default 2), or an engine emulator (tests/emulators: `--parallel
--slots`, each stream `--ttft-ms` to its first token and `--itl-ms` a token, so its throughput grows
with its slots as a GPU engine's batch does, where llama-server on this CPU makes about as many tokens/s
with 1 slot as with 2) relayed as `engine: openai` with the gateway's admission at `--slots`. For each
flood size, each scheduler runs in the order baseline, after, after, baseline (`--rounds 2`; 1:
baseline, after; with two baselines: b1, b2, after, after, b2, b1), so a machine that drifts counts for
all; each run replaces the replica's admission while the gateway is idle (a fresh one: no flow in its window), so every run meets the same engine
process and the same gateway:

1. team-a alone: `N` streams of `--tokens` tokens at once; its tokens/s over its served streams;
2. team-b alone on the idle gateway: one short stream, its TTFT (team-b has now used the replica);
3. team-a's flood again, and team-b's request 0.5 s after it (then `--samples - 1` more, `--spacing`
   apart), each delayed by a seeded draw over one flood stream's duration (the emulators' streams run in
   step, and a fixed offset would meet them at the same phase every time): team-b's TTFT against step 2's,
   team-a's tokens/s against step 1's ("share kept"), team-a's 429s.

Schedulers: `before` is the gateway as it was (`newcomer_slots` kept none on 2 slots; one queue
of 16 for all flows: `scheduler: {newcomer_slots: 0, max_queue_per_flow: null}`, `max_queue: 16`);
`after` the defaults now (a kept slot on any replica of 2 or more, which a resumable stream borrows and gives
back to a newcomer by preemption; each flow's own queue of 64, `max_queue` 256); `kept` the kept slot
without preemption (issue 38's first step); `unkept` the defaults without the kept slot. The ratios are the
figures: the machine is shared and its absolute speed drifts.

Every request computes its whole prompt (`cache_prompt: false`) unless `--prompt-cache`: then llama-server
keeps its default and each flood stream has a prompt of its own (so the cache cannot serve one stream's
prompt to the next, but a preempted stream's resume finds its own prefix, as a user's would).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from dataclasses import dataclass

from benchmarks.scheduling import Gateway, Result, serving
from gateway.config import SchedulerConfig
from tests.emulators.fixture import running_emulator

SCHEDULERS: dict[str, tuple[SchedulerConfig, int]] = {
    "before": (SchedulerConfig(newcomer_slots=0, max_queue_per_flow=None), 16),
    "after": (SchedulerConfig(preempt=True), 256),
    "kept": (SchedulerConfig(preempt=False), 256),
    "unkept": (SchedulerConfig(newcomer_slots=0), 256),
}
"""`after`: the defaults, with preemption (the default on llama-server, vLLM and SGLang; the emulators stand for
the last two but are relayed as `engine: openai`, where an operator turns it on); `kept`: a kept slot without
preemption (issue 38's first step); `unkept`: the defaults without a kept slot (work-conserving: the flood takes
every slot), the other side of the trade a kept slot makes."""
ENGINES = ("llama_server", "vllm", "sglang")
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


async def flood(gw: Gateway, n: int, tokens: int, neighbour: int = 0, spacing: float = 1.0, jitter: float = 0.0,
                rng: random.Random | None = None) -> tuple[list[Result], float, list[Result]]:
    """team-a's `n` streams at once (and team-b's `neighbour` requests from 0.5 s on, each `spacing` after the
    last one's end plus a draw from [0, `jitter`): an engine whose streams run in step would otherwise meet
    team-b at the same phase of a stream every time): team-a's results, its tokens/s over its served streams,
    team-b's results (only those sent while the flood ran)."""
    t0 = time.perf_counter()
    prompts = [f"{FLOOD_PROMPT} Chapter {i + 1}." if gw.prompt_cache else FLOOD_PROMPT for i in range(n)]
    a = [asyncio.create_task(gw.chat("team-a", prompt, tokens)) for prompt in prompts]
    b: list[Result] = []
    draw = (rng or random.Random(0)).uniform
    if neighbour:
        await asyncio.sleep(0.5 + draw(0.0, jitter))
        for i in range(neighbour):
            if i:
                await asyncio.sleep(spacing + draw(0.0, jitter))
            if all(t.done() for t in a):
                break
            b.append(await gw.chat("team-b", NEIGHBOUR_PROMPT, 8))
    done = await asyncio.gather(*a)
    served = [r for r in done if r.status == 200]
    wall = max(r.seconds for r in served) if served else time.perf_counter() - t0
    return list(done), sum(r.tokens for r in served) / wall, b


async def one_run(gw: Gateway, scheduler: str, n: int, args: argparse.Namespace, rng: random.Random) -> Run:
    policy, queue = SCHEDULERS[scheduler]
    gw.use(policy, queue)
    alone, alone_rate, _ = await flood(gw, n, args.tokens)
    served = [r for r in alone if r.status == 200]
    stream = max((r.seconds for r in served), default=1.0) * min(args.slots, n) / max(len(served), 1)
    gw.use(policy, queue)  # a fresh window: team-a's run alone does not count as a flow seen
    idle = await gw.chat("team-b", NEIGHBOUR_PROMPT, 8)
    done, rate, b = await flood(gw, n, args.tokens, args.samples, args.spacing, stream, rng)
    run = Run(alone_rate, sum(r.status == 429 for r in alone), idle.ttft or float("nan"),
              [r.ttft for r in b], [r.status for r in b], rate, sum(r.status == 429 for r in done))
    print(f" {n} streams, {scheduler}: team-b idle {run.idle_ttft:.3f} s, flooded {run.ttfts} {run.statuses}; "
          f"team-a {alone_rate:.1f} -> {rate:.1f} tokens/s, 429 {run.alone_refused} / {run.refused}",
          file=sys.stderr, flush=True)
    return run


def ratio(run: Run) -> float:
    """team-b's flooded TTFT (the median of its samples; a refused sample counts as infinite) / idle."""
    return statistics.median(t if t is not None else float("inf") for t in run.ttfts) / run.idle_ttft


async def bench(gw: Gateway, engine: str, args: argparse.Namespace,
                results: dict[tuple[str, int, str], list[Run]]) -> None:
    gw.prompt_cache = args.prompt_cache
    base = list(args.baseline)
    order = [*base, "after"] * args.rounds if args.rounds > 2 else \
        ([*base, "after", "after", *reversed(base)] if args.rounds == 2 else [*base, "after"])
    for n in args.floods:
        for scheduler in order:
            print(f"{engine}:", end="", file=sys.stderr)
            rng = random.Random(f"{args.seed}/{n}/{len(results.get((engine, n, scheduler), []))}")  # same draws for each scheduler
            results.setdefault((engine, n, scheduler), []).append(await one_run(gw, scheduler, n, args, rng))


def report(results: dict[tuple[str, int, str], list[Run]], args: argparse.Namespace) -> None:
    print(f"fairness: {args.slots} slots (llama-server: {args.threads} thread(s), prompt cache "
          f"{'on, a prompt per flood stream' if args.prompt_cache else 'off'}; emulators: --itl-ms {args.itl_ms:g} "
          f"--ttft-ms {args.ttft_ms:g}), team-a floods N streams of {args.tokens} tokens, team-b sends one of 8 tokens "
          f"0.5 s later ({args.samples} in a row); per flood and engine the schedulers run in the order "
          f"{', '.join(args.baseline)}, after (rounds: {args.rounds}; each run: team-a alone, team-b alone, then both)")
    print("| engine | flood | scheduler | runs | team-b TTFT idle (s) | team-b TTFT flooded (s) | **ratio** | "
          "team-a tok/s alone | team-a tok/s with team-b | **share kept** | team-a 429 (of N) | team-b non-200 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (engine, n, scheduler), runs in results.items():
        idle = "/".join(f"{r.idle_ttft:.2f}" for r in runs)
        flooded = "/".join(f"{statistics.median(t for t in r.ttfts if t is not None):.2f}"
                           if any(t is not None for t in r.ttfts) else "-" for r in runs)
        b_ratio = "/".join(f"{ratio(r):.1f}x" for r in runs)
        alone = "/".join(f"{r.alone_rate:.1f}" for r in runs)
        rate = "/".join(f"{r.rate:.1f}" for r in runs)
        a_ratio = "/".join(f"{r.rate / r.alone_rate:.0%}" for r in runs)
        refused = "/".join(str(r.refused) for r in runs)
        b_bad = "/".join(str(sum(s != 200 for s in r.statuses)) for r in runs)
        print(f"| {engine} | {n} | {scheduler} | {len(runs)} | {idle} | {flooded} | {b_ratio} | {alone} | {rate} | "
              f"{a_ratio} | {refused} | {b_bad} |")
    print("\nmedians of the runs (target: team-b within 2x of idle, team-a keeping >= 90 %, no 429):")
    for (engine, n, scheduler), runs in results.items():
        b = statistics.median(ratio(r) for r in runs)
        a = statistics.median(r.rate / r.alone_rate for r in runs)
        print(f"  {engine:12} {n:3} streams {scheduler:9} team-b {b:.1f}x idle, team-a {a:.0%} of alone, "
              f"429 {sum(r.refused for r in runs)}")


async def on_engine(engine: str, args: argparse.Namespace, results: dict[tuple[str, int, str], list[Run]]) -> None:
    if engine == "llama_server":
        await serving(args.slots, args.threads, args.slots * 256, lambda gw: bench(gw, engine, args, results))
        return
    with running_emulator(engine, "--tokens", "100000", "--itl-ms", str(args.itl_ms), "--ttft-ms", str(args.ttft_ms),
                          "--parallel", str(args.slots)) as emu:
        await serving(args.slots, args.threads, 0, lambda gw: bench(gw, engine, args, results), upstream=emu.url)


async def everything(args: argparse.Namespace) -> None:
    results: dict[tuple[str, int, str], list[Run]] = {}
    for engine in args.engines:
        await on_engine(engine, args, results)
    report(results, args)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", type=lambda s: [x for x in s.split(",") if x], default=list(ENGINES),
                   help="llama_server (real), vllm and sglang (their emulators, tests/emulators)")
    p.add_argument("--floods", type=lambda s: [int(x) for x in s.split(",")], default=[12, 40])
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--itl-ms", type=float, default=20.0, help="the emulators' time per token of each stream")
    p.add_argument("--ttft-ms", type=float, default=50.0, help="the emulators' time to a stream's first token")
    p.add_argument("--samples", type=int, default=3, help="team-b's requests under each flood, one after another")
    p.add_argument("--spacing", type=float, default=1.0, help="seconds between team-b's requests (plus a random part)")
    p.add_argument("--seed", type=int, default=38)
    p.add_argument("--prompt-cache", action="store_true",
                   help="leave llama-server's prompt cache on (its default), each flood stream with a prompt of its own; "
                        "without it every request computes its whole prompt (`cache_prompt: false`), a resumed one too")
    p.add_argument("--rounds", type=int, default=2, help="1: before, after; 2: before, after, after, before")
    p.add_argument("--baseline", type=lambda s: [x for x in s.split(",") if x], default=["before"],
                   help="what `after` is compared with: the gateway before issue 38, or no kept slot at all")
    args = p.parse_args(argv)
    if not args.baseline or set(args.baseline) - (set(SCHEDULERS) - {"after"}):
        p.error(f"--baseline: one or two of {', '.join(sorted(set(SCHEDULERS) - {'after'}))}")
    unknown = set(args.engines) - set(ENGINES)
    if unknown:
        p.error(f"unknown engines {sorted(unknown)}; choose from {', '.join(ENGINES)}")
    asyncio.run(everything(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
