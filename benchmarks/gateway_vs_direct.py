"""Decode tokens/s and time to first token: through the gateway vs llama-cpp-python called directly.

Same model, prompt, settings and output length (EOS banned, so every run makes exactly
--tokens tokens), runs interleaved direct/gateway so that machine drift hits both.
Prints medians and the ratios. Usage: python benchmarks/gateway_vs_direct.py [--runs 5] [--tokens 128]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.modelsource import embedded_model_path  # noqa: E402
from tests.gateway_process import gateway  # noqa: E402
from tests.model_facts import eos_token_id  # noqa: E402

MESSAGES = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


def direct_run(llm: object, tokens: int) -> tuple[float, float]:
    started = time.perf_counter()
    stamps: list[float] = []
    stream = llm.create_chat_completion(  # type: ignore[attr-defined]
        messages=MESSAGES, max_tokens=tokens, temperature=0, stream=True, logit_bias={eos_token_id(): -100.0}
    )
    for chunk in stream:
        if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
            stamps.append(time.perf_counter())
    return stamps[0] - started, (len(stamps) - 1) / (stamps[-1] - stamps[0])


def gateway_run(client: httpx.Client, url: str, model: str, tokens: int) -> tuple[float, float]:
    body = {"model": model, "messages": MESSAGES, "max_tokens": tokens, "temperature": 0, "stream": True,
            "logit_bias": {str(eos_token_id()): -100}}
    started = time.perf_counter()
    stamps: list[float] = []
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = orjson.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                stamps.append(time.perf_counter())
    return stamps[0] - started, (len(stamps) - 1) / (stamps[-1] - stamps[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1), help="as the planner: all cores but one")
    parser.add_argument("--ctx", type=int, default=4096)
    args = parser.parse_args()

    from llama_cpp import Llama

    path = str(embedded_model_path())
    print(f"model {Path(path).name}, {args.tokens} tokens per run, {args.runs} runs each, threads={args.threads}, n_ctx={args.ctx}")
    llm = Llama(model_path=path, n_ctx=args.ctx, n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
    config = f"models:\n  - source: default\n    context_length: {args.ctx}\n    threads: {args.threads}\n"
    results: dict[str, list[tuple[float, float]]] = {"direct": [], "gateway": []}
    with gateway(config_yaml=config) as gw, httpx.Client(timeout=300) as client:
        model = "smollm2-135m-instruct"
        direct_run(llm, 8)  # warm-up, not counted
        gateway_run(client, gw.url, model, 8)
        for i in range(args.runs):
            results["direct"].append(direct_run(llm, args.tokens))
            results["gateway"].append(gateway_run(client, gw.url, model, args.tokens))
            print(f"  run {i + 1}/{args.runs}: direct {results['direct'][-1][1]:.1f} tok/s, gateway {results['gateway'][-1][1]:.1f} tok/s", flush=True)

    def med(name: str, idx: int) -> float:
        return statistics.median(r[idx] for r in results[name])

    print(f"{'':10}{'TTFT p50 (ms)':>15}{'decode p50 (tok/s)':>20}")
    for name in ("direct", "gateway"):
        print(f"{name:10}{med(name, 0) * 1000:15.1f}{med(name, 1):20.1f}")
    print(f"decode ratio gateway/direct: {med('gateway', 1) / med('direct', 1):.3f}   (target >= 0.97)")
    print(f"added TTFT: {(med('gateway', 0) - med('direct', 0)) * 1000:+.1f} ms   (target < 5 ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
