"""Measure one variant: a real `enginegate serve` with exactly these options, checked, then benched.

Each variant runs in its own gateway process (the real adapter, started as `serve` starts it), so a
crash or a hung engine ends that variant only, its memory is its own, and nothing is left behind:
the gateway is stopped with SIGTERM (it stops its engines), then its process group is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx
import psutil
import yaml

from adapters.process import free_port
from gateway.bench import SLO, BenchPlan, Level, LevelStats, PromptSource, Target, run_bench
from gateway.bench.runner import BenchError
from gateway.bench.workload import Length
from gateway.planning.measured import VariantResult
from gateway.planning.workload import Workload
from gateway.tuning.record import TUNE_DIR_ENV
from gateway.tuning.variants import Variant

SERVED = "tune"
PR_SET_PDEATHSIG = 1
CHECK_PROMPT = "Say hello in one short sentence."
Say = Callable[[str], None]


def _config(v: Variant, model: Path, w: Workload) -> str:
    return yaml.safe_dump({
        "shutdown_grace_seconds": 0,
        "models": [{"source": str(model), "name": SERVED, "engine": v.engine, "embeddings": False,
                    "fallback": False, "max_queue": max(16, 4 * w.concurrency), "options": v.options}],
    })


def _die_with_parent() -> None:  # in the child between fork and exec
    """Linux: the variant's gateway gets SIGTERM (drain, stop its engines) if tune itself is killed."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _rss(pid: int) -> int:
    total = 0
    for p in _tree(pid):
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


def _peak_rss(pid: int) -> int:
    """Sum of each live process's own peak (VmHWM, Linux); 0 where the kernel does not say."""
    total = 0
    for p in _tree(pid):
        with contextlib.suppress(OSError, ValueError, psutil.Error):
            for line in Path(f"/proc/{p.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1]) * 1024
    return total


def _log_tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:])


class _Gateway:
    def __init__(self, v: Variant, model: Path, w: Workload, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = workdir / "gateway.yaml"
        config.write_text(_config(v, model, w))
        self.log = workdir / "gateway.log"
        (workdir / "tune").mkdir(exist_ok=True)
        env = {**os.environ, TUNE_DIR_ENV: str(workdir / "tune"), "PYTHONUNBUFFERED": "1"}
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", str(self.port),
                 "--log-level", "warning"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                preexec_fn=_die_with_parent)

    async def ready(self, timeout_s: float) -> str | None:
        """None once /ready answers 200; else why not (the process exited, or the time ran out)."""
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=5) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    return f"the gateway exited with status {self.process.returncode}: {_log_tail(self.log)}"
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(self.url + "/ready")).status_code == 200:
                        return None
                await asyncio.sleep(0.2)
        return f"not ready within {timeout_s:.0f} s: {_log_tail(self.log)}"

    async def check(self) -> str | None:
        """None when a chat completion comes back well formed with generated text; else what was wrong."""
        body = {"model": SERVED, "messages": [{"role": "user", "content": CHECK_PROMPT}], "max_tokens": 8,
                "temperature": 0}
        try:
            async with httpx.AsyncClient(timeout=120) as client:
                r = await client.post(self.url + "/v1/chat/completions", json=body)
        except httpx.HTTPError as exc:
            return f"check request failed: {exc!r}"
        if r.status_code != 200:
            return f"check request answered {r.status_code}: {r.text[:200]}"
        try:
            data = r.json()
            content = data["choices"][0]["message"]["content"]
            tokens = data["usage"]["completion_tokens"]
        except (ValueError, KeyError, IndexError, TypeError):
            return f"check answer is not a chat completion: {r.text[:200]}"
        if not isinstance(content, str) or not content.strip() or not isinstance(tokens, int) or tokens < 1:
            return f"check answer has no generated text: {r.text[:200]}"
        return None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)  # its own session: the gateway and what it started
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)


def _level(stats: list[LevelStats], concurrency: int) -> LevelStats | None:
    return next((s for s in stats if s.label == f"c={concurrency}"), None)


def _from_stats(v: Variant, stats: list[LevelStats], w: Workload) -> dict[str, object]:
    alone, load = _level(stats, 1), _level(stats, w.concurrency)
    out: dict[str, object] = {}
    if alone is not None and alone.ok:
        out["decode_tokens_per_s"] = 1.0 / alone.tpot.p50 if alone.tpot.p50 else None
        out["prefill_s"] = alone.ttft.p50
    if load is not None:
        out.update(ttft_p50_s=load.ttft.p50, ttft_p99_s=load.ttft.p99, tpot_p50_s=load.tpot.p50,
                   tpot_p99_s=load.tpot.p99, output_tokens_per_s=load.output_tps, request_rate=load.request_rate,
                   goodput_rps=load.goodput_rps, goodput_fraction=load.goodput_fraction)
    out["errors"] = {k: n for s in stats for k, n in s.errors.items()}
    return out


async def measure(v: Variant, model: Path, w: Workload, *, slo: SLO, requests: int, levels: Sequence[int],
                  start_timeout_s: float, seed: int, say: Say, params_active: int | None = None) -> VariantResult:
    common = {"engine": v.engine, "label": v.label, "options": v.options, "concurrency": w.concurrency,
              "predicted_decode_tokens_per_s": v.predicted_decode, "predicted_prefill_s": v.predicted_prefill,
              "predicted_aggregate_tokens_per_s": v.predicted_aggregate,
              "bytes_per_token": v.bytes_per_token, "prompt_tokens": w.prompt_tokens, "params_active": params_active}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="enginegate-tune-") as tmp:
        gw = _Gateway(v, model, w, Path(tmp))
        peak = 0
        sampling = True

        async def sample() -> None:
            nonlocal peak
            while sampling:
                peak = max(peak, await asyncio.to_thread(_rss, gw.process.pid))
                await asyncio.sleep(0.25)

        sampler = asyncio.create_task(sample())
        try:
            problem = await gw.ready(start_timeout_s)
            load_s = time.perf_counter() - t0
            if problem is None:
                say(f"  ready in {load_s:.1f} s; checking an answer")
                problem = await gw.check()
            if problem is not None:
                return VariantResult(**common, status="failed", reason=problem, load_s=round(load_s, 2),
                                     wall_s=round(time.perf_counter() - t0, 2))
            say(f"  measuring {', '.join(f'c={c}' for c in levels)}: {requests} request(s) each, "
                f"{w.prompt_tokens} -> {w.output_tokens} tokens")
            source = PromptSource("chat", Length("fixed", w.prompt_tokens), Length("fixed", w.output_tokens))
            target = Target(v.label, gw.url + "/v1", SERVED, timeout_s=300.0)
            bench = BenchPlan([target], [Level("concurrency", c) for c in levels], source, slo, requests=requests,
                              warmup=1, seed=seed, ceiling=False)
            try:
                result = await run_bench(bench)
            except BenchError as exc:
                return VariantResult(**common, status="failed", reason=str(exc), load_s=round(load_s, 2),
                                     wall_s=round(time.perf_counter() - t0, 2))
            stats = result.levels[v.label]
            peak = max(peak, await asyncio.to_thread(_peak_rss, gw.process.pid))
            figures = _from_stats(v, stats, w)
            ok = sum(s.ok for s in stats)
            sent = sum(s.sent for s in stats)
            if ok == 0:
                examples = {k: e for s in stats for k, e in s.error_examples.items()}
                return VariantResult(**common, **figures, status="failed", load_s=round(load_s, 2),  # type: ignore[arg-type]
                                     reason=f"every measured request failed: {examples}", peak_memory_bytes=peak,
                                     wall_s=round(time.perf_counter() - t0, 2))
            reason = None if ok == sent else f"{sent - ok} of {sent} requests failed"
            return VariantResult(**common, **figures, status="ok", reason=reason, load_s=round(load_s, 2),  # type: ignore[arg-type]
                                 peak_memory_bytes=peak, wall_s=round(time.perf_counter() - t0, 2))
        finally:
            sampling = False
            await asyncio.to_thread(gw.stop)
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
