"""What loading a model on demand costs, and what the anti-thrash rule saves.

1. Swap cost, per engine (in-process llama.cpp, llama-server): the time from a request for an
   unloaded model to its first token through the gateway, against the same engine loaded directly
   (llama-cpp-python's `Llama(...)` then its first streamed token; the llama-server binary with the
   gateway's own command line, /health polled every 5 ms, then its first streamed token). Runs
   interleaved, medians; the gateway's model is unloaded (admin API) before each run.
2. Two models alternating under 4 concurrent clients, with a RAM budget that holds one: loads per
   100 requests with the anti-thrash rule (swap_batch_requests 16) and without it (1).

Usage: python benchmarks/model_swap.py [--runs 5] [--requests 100]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from adapters.process import Endpoint, free_port  # noqa: E402
from gateway.config import Settings  # noqa: E402
from gateway.modelsource import embedded_model_path  # noqa: E402
from tests.gateway_process import gateway  # noqa: E402

CTX = 512
THREADS = 1
MESSAGES = [{"role": "user", "content": "Say hello."}]
MODELS_YAML = f"""
memory_budget: {{ram_bytes: {180 * 2**20}}}
swap_batch_requests: {{batch}}
models:
  - {{name: inproc, engine: llamacpp, context_length: {CTX}, threads: {THREADS}, embeddings: false}}
  - {{name: server, engine: llama_server, context_length: {CTX}, threads: {THREADS}, embeddings: false}}
"""


def first_token(client: httpx.Client, url: str, model: str | None) -> float:
    """Seconds from sending the request to the first content token (the clock starts at the call)."""
    started = time.perf_counter()
    body = {"messages": MESSAGES, "max_tokens": 4, "temperature": 0, "stream": True, **({"model": model} if model else {})}
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = orjson.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    return time.perf_counter() - started
    raise RuntimeError("no token")


def direct_llamacpp() -> float:
    from llama_cpp import Llama

    started = time.perf_counter()
    llm = Llama(model_path=str(embedded_model_path()), n_ctx=CTX, n_threads=THREADS, n_threads_batch=THREADS, verbose=False)
    try:
        for chunk in llm.create_chat_completion(messages=MESSAGES, max_tokens=4, temperature=0, stream=True):
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                return time.perf_counter() - started
        raise RuntimeError("no token")
    finally:
        llm.close()


def gateway_argv(endpoint: Endpoint) -> list[str]:
    """The command line the gateway launches llama-server with for model `server`."""
    from gateway.runtime import Runtime

    settings = Settings(**yaml.safe_load(MODELS_YAML.replace("{batch}", "16")))
    backend = Runtime.build(settings).models.get("server")
    assert backend is not None
    return list(backend.adapter.launch(endpoint).argv)  # type: ignore[attr-defined]


def direct_llama_server(client: httpx.Client) -> float:
    endpoint = Endpoint("127.0.0.1", free_port(), "")
    argv = gateway_argv(endpoint)
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = started + 120
        while time.perf_counter() < deadline:
            try:
                if client.get(endpoint.base_url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.005)
        return (time.perf_counter() - started) + first_token(client, endpoint.base_url, None)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def swap_cost(runs: int) -> list[tuple[str, float, float, float, float]]:
    rows = []
    with gateway(config_yaml=MODELS_YAML.replace("{batch}", "16")) as gw, httpx.Client(timeout=300) as client:
        for model, direct in (("inproc", direct_llamacpp), ("server", lambda: direct_llama_server(client))):
            direct_s, through_s = [], []
            for _ in range(runs):
                direct_s.append(direct())
                for name in ("inproc", "server"):
                    client.post(f"{gw.url}/admin/models/{name}/unload").raise_for_status()
                through_s.append(first_token(client, gw.url, model))
            rows.append((model, statistics.median(direct_s), statistics.median(through_s), min(direct_s), min(through_s)))
    return rows


async def alternate(url: str, requests: int, clients: int = 4) -> tuple[float, int]:
    async with httpx.AsyncClient(timeout=600) as client:
        async def one(start: int) -> int:
            ok = 0
            for i in range(requests // clients):
                body = {"model": ("inproc", "inproc2")[(start + i) % 2], "messages": MESSAGES, "max_tokens": 4}
                ok += (await client.post(url + "/v1/chat/completions", json=body)).status_code == 200
            return ok

        started = time.perf_counter()
        done = await asyncio.gather(*(one(c) for c in range(clients)))
        return time.perf_counter() - started, sum(done)


def loads(metrics: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith("enginegate_model_loads_total{"))


def thrash(requests: int) -> list[tuple[int, float, float, int]]:
    rows = []
    for batch in (16, 1):
        config = MODELS_YAML.replace("{batch}", str(batch)).replace("name: server, engine: llama_server", "name: inproc2, engine: llamacpp")
        with gateway(config_yaml=config) as gw:
            wall, ok = asyncio.run(alternate(gw.url, requests))
            n = loads(httpx.get(gw.url + "/metrics", timeout=10).text)
        rows.append((batch, n * 100 / requests, wall, ok))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--requests", type=int, default=100)
    args = parser.parse_args()
    print(f"swap cost: request for an unloaded model -> first token (median of {args.runs}; ctx {CTX}, {THREADS} thread)")
    print(f"{'engine':<22} {'direct load+1st token':>22} {'through gateway':>16} {'added':>9} {'added (fastest runs)':>21}")
    for model, direct_s, through_s, direct_min, through_min in swap_cost(args.runs):
        name = "in-process llama.cpp" if model == "inproc" else "llama-server"
        print(f"{name:<22} {direct_s * 1000:>19.0f} ms {through_s * 1000:>13.0f} ms {(through_s - direct_s) * 1000:>+6.0f} ms"
              f" {(through_min - direct_min) * 1000:>+18.0f} ms")
    print(f"\ntwo models alternating, 4 clients, {args.requests} requests, RAM budget for one:")
    print(f"{'rule':<34} {'loads per 100 requests':>22} {'wall':>8} {'ok':>5}")
    rows = thrash(args.requests)
    for batch, per100, wall, ok in rows:
        rule = f"anti-thrash (swap_batch_requests {batch})" if batch > 1 else "without (swap_batch_requests 1)"
        print(f"{rule:<34} {per100:>22.1f} {wall:>7.1f}s {ok:>5}")
    print(f"ratio: {rows[1][1] / max(rows[0][1], 1e-9):.2f}x the loads without the rule")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
