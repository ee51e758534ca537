"""Shared by the relay benchmarks: processes on loopback, a load generator, percentiles."""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import httpx
import orjson

REPO_ROOT = Path(__file__).resolve().parents[1]
BODY = {"model": "emulated-model", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 16}


def spawn(module_args: Sequence[str]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen([sys.executable, "-m", *module_args], cwd=REPO_ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise RuntimeError(f"{proc.args} exited {proc.returncode}: {err[-2000:]}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} not up after {timeout}s")
        time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Run:
    latencies: list[float]
    seconds: float

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.seconds

    @property
    def p50_ms(self) -> float:
        return pct(self.latencies, 0.50) * 1000

    @property
    def p99_ms(self) -> float:
        return pct(self.latencies, 0.99) * 1000


def _session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), skip_auto_headers=("User-Agent",))


async def load(url: str, concurrency: int, requests: int, body: dict[str, object] = BODY,
               extra_headers: dict[str, str] | None = None) -> Run:
    """`requests` non-streaming POSTs from `concurrency` workers; every answer must be 200."""
    payload = orjson.dumps(body)
    headers = {"Content-Type": "application/json", **(extra_headers or {})}
    latencies: list[float] = []
    left = requests

    async with _session() as session:
        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                t0 = time.perf_counter()
                async with session.post(url, data=payload, headers=headers) as resp:
                    data = await resp.read()
                    if resp.status != 200:
                        raise RuntimeError(f"{resp.status}: {data[:300]!r}")
                latencies.append(time.perf_counter() - t0)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return Run(latencies, time.perf_counter() - started)


@dataclass
class StreamRun:
    ttfts: list[float]
    spans: list[float]  # first to last content event
    events: int
    reads_with_several_events: int
    reads: int


async def stream_load(url: str, requests: int, tokens: int, model: str = "emulated-model") -> StreamRun:
    """Sequential streams; times every content event as the client's socket delivers it."""
    payload = orjson.dumps({**BODY, "model": model, "max_tokens": tokens, "stream": True})
    run = StreamRun([], [], 0, 0, 0)
    async with _session() as session:
        for _ in range(requests):
            t0 = time.perf_counter()
            first = last = None
            async with session.post(url, data=payload, headers={"Content-Type": "application/json"}) as resp:
                assert resp.status == 200, await resp.text()
                async for chunk in resp.content.iter_any():
                    now = time.perf_counter()
                    content = chunk.count(b'"content":"') - chunk.count(b'"content":""')
                    run.reads += 1
                    run.events += content
                    if content > 1:
                        run.reads_with_several_events += 1
                    if content:
                        first = first if first is not None else now
                        last = now
            assert first is not None and last is not None
            run.ttfts.append(first - t0)
            run.spans.append(last - first)
    return run


def median_ms(values: Sequence[float]) -> float:
    return statistics.median(values) * 1000
