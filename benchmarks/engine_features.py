"""The engine's own speed-ups on a real llama-server, measured against each other in one run.

    python -m benchmarks.engine_features [--rounds 4] [--json docs/bench/engine-features.json]

Every variant is a llama-server started with the command line the planner's options produce
(`adapters.llama_server.launch_args`), one thread each, all of them up at once; requests go to
them in turn (A, B, C, A, B, C...) so the machine's noise falls on every variant alike. Figures
for speculation are tokens per CPU-second of the engine process (its own user + system time: on a
machine shared with other jobs wall-clock rates moved +-20 % between identical variants, CPU time
does not see the other jobs) and tokens over the wall time of the concurrent requests; prefill and
drafts come from each response's `timings` (prompt_ms, draft_n / draft_n_accepted).

Rows: n-gram speculation (none / ngram-mod / ngram-simple) on an edit workload (fix the spelling
of a passage: the output copies most of the input; every request a passage not seen before, since
ngram-mod's table persists across requests) and on free generation, at 1, 2 and 4 streams;
KV f16 vs q8_0 at an 8k context (KV size from the planner's arithmetic, RSS, prefill and decode rates);
shared-prefix time to first token with the host-RAM prompt cache on and off (one slot, two
documents asked about in turn, so each request finds the slot holding the other document).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from adapters.llama_server import find_llama_server, launch_args
from adapters.process import Endpoint, free_port
from benchmarks.harness import stop, wait_http
from gateway.modelsource import embedded_model_path
from gateway.planning import kv_bytes, load_spec

PASSAGE = (
    "The lighthouse keeper woke befor dawn every morning and climed the spiral stairs to the lamp room. "
    "He cleand the great lens with a soft cloth, checked the oil in the resevoir and wrote the wether in "
    "his log book. In the afternon he walked along the cliffs to the vilage, where the baker saved him a "
    "loaf of bread and the postmistress handed him the letters that had arived by the morning boat. "
    "Most of them were from his sister, who lived in the city and worried that he was lonley. He always "
    "wrote back the same evening, telling her about the ships he had seen, the storms that had pased and "
    "the seals that sunned themselfs on the rocks below the tower."
)
SUBJECTS = ["a fox who learns to sail", "a robot that tends a garden", "a baker on the moon", "two rival clockmakers",
            "a lighthouse cat", "a lost umbrella", "a dragon afraid of heights", "a river that runs uphill",
            "a librarian who collects echoes", "the last tram of the night", "a snowman in summer", "a map of nowhere",
            "a violin made of ice", "a detective owl", "a town without mirrors", "a kite that will not land"]


def _typos(text: str, seed: int) -> str:
    """Every fourth long word loses a letter: a passage to correct, different for every seed."""
    words = text.split()
    for i in range(seed % 4, len(words), 4):
        w = words[i]
        if len(w) > 4:
            cut = 1 + (seed + i) % (len(w) - 2)
            words[i] = w[:cut] + w[cut + 1:]
    return " ".join(words)


def edit_prompt(k: int) -> list[dict[str, str]]:
    """The k-th edit: a different passage each time, so no variant sees the same text twice (ngram-mod's table
    persists across requests and would otherwise draft the previous round's answer)."""
    sentences = PASSAGE.split(". ")
    story = ". ".join(sentences[(k + j) % len(sentences)] for j in range(len(sentences)))
    text = story.replace("The lighthouse keeper", f"{SUBJECTS[k % len(SUBJECTS)].capitalize()}'s keeper")
    return [{"role": "user", "content": "Fix the spelling mistakes in this text. Return the whole corrected text "
                                        f"and nothing else.\n\n{_typos(text, k)}"}]


def free_prompt(k: int) -> list[dict[str, str]]:
    places = ["in a desert", "under the sea", "in a busy city", "on a mountain", "in a forest", "on a ship"]
    return [{"role": "user", "content": f"Write a short story about {SUBJECTS[k % len(SUBJECTS)]} "
                                        f"{places[k // len(SUBJECTS) % len(places)]}, in the year {1700 + 13 * k}."}]


EDIT = edit_prompt(0)
DOCUMENTS = [
    " ".join(f"Section {i}: the committee reviewed budget line {i * 7} and approved {i % 5 + 1} new posts "
             f"for the {['north', 'south', 'east', 'west'][i % 4]} office." for i in range(30)),
    " ".join(f"Clause {i}: the tenant shall keep the premises at unit {i * 3} in good repair and notify the "
             f"landlord within {i % 9 + 2} days of any damage." for i in range(30)),
]
QUESTIONS = ["Summarise the first point in one sentence.", "What is the last number mentioned?",
             "Name one place mentioned.", "How many items are there?"]
KV_PROMPT = " ".join(f"Record {i}: sensor {i % 17} read {i * 13 % 997} units at hour {i % 24}." for i in range(150))


@dataclass
class Server:
    name: str
    options: dict[str, Any]
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Sample:
    decode: list[float] = field(default_factory=list)
    aggregate: list[float] = field(default_factory=list)
    per_cpu_s: list[float] = field(default_factory=list)
    """Tokens generated per CPU-second the engine process used: robust to other jobs on a shared machine."""
    prompt_ms: list[float] = field(default_factory=list)
    ttft_ms: list[float] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0
    cached: list[int] = field(default_factory=list)


def start(servers: Sequence[Server], model: Path, workdir: Path) -> None:
    binary = find_llama_server(None)
    if binary is None:
        raise SystemExit("needs llama-server: enginegate engines install llama-server")
    for s in servers:
        s.port = free_port()
        s.log = workdir / f"{s.name}.log"
        argv = launch_args(binary, model, "m", s.options, Endpoint("127.0.0.1", s.port, ""))
        s.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=s.log.open("wb"), start_new_session=True)
    for s in servers:
        assert s.proc is not None
        wait_http(s.url + "/health", s.proc, timeout=120)  # llama-server answers 503 while it loads


def stop_all(servers: Sequence[Server]) -> None:
    for s in servers:
        if s.proc is not None:
            stop(s.proc)


def cpu_seconds(s: Server) -> float:
    """CPU time (user + system) the engine process has used: only its own work, whatever else runs."""
    assert s.proc is not None
    times = psutil.Process(s.proc.pid).cpu_times()
    return float(times.user + times.system)


async def chat(client: httpx.AsyncClient, s: Server, messages: list[dict[str, str]], max_tokens: int,
               ignore_eos: bool = False) -> dict[str, Any]:
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": ignore_eos}
    r = await client.post(s.url + "/v1/chat/completions", json=body)
    r.raise_for_status()
    timings: dict[str, Any] = r.json()["timings"]
    return timings


def _record(sample: Sample, t: Mapping[str, Any]) -> None:
    if t.get("predicted_ms"):
        sample.decode.append(t["predicted_n"] / t["predicted_ms"] * 1000)
    sample.prompt_ms.append(float(t.get("prompt_ms") or 0))
    sample.drafted += int(t.get("draft_n") or 0)
    sample.accepted += int(t.get("draft_n_accepted") or 0)
    sample.cached.append(int(t.get("cache_n") or 0))


async def speculation(servers: Sequence[Server], rounds: int, tokens: int) -> dict[str, dict[str, Sample]]:
    """{workload/streams: {server: Sample}} for the edit and free-generation prompts at 1 and 4 streams."""
    out: dict[str, dict[str, Sample]] = {}
    async with httpx.AsyncClient(timeout=600) as client:
        for s in servers:  # warm-up: first request loads pages, the n-gram table starts empty
            await chat(client, s, EDIT, 16)
        k = 1  # prompt 0 was the warm-up
        for label, prompt in (("edit", edit_prompt), ("free", free_prompt)):
            for streams in (1, 2, 4):
                table = out.setdefault(f"{label}/{streams}", {s.name: Sample() for s in servers})
                for _ in range(rounds):
                    batch = [prompt(k + i) for i in range(streams)]  # every variant gets the same, unseen prompts
                    k += streams
                    for s in servers:
                        cpu = cpu_seconds(s)
                        started = time.perf_counter()
                        results = await asyncio.gather(*(chat(client, s, m, tokens) for m in batch))
                        wall = time.perf_counter() - started
                        used = cpu_seconds(s) - cpu
                        for t in results:
                            _record(table[s.name], t)
                        produced = sum(t["predicted_n"] for t in results)
                        table[s.name].aggregate.append(produced / wall)
                        if used > 0:
                            table[s.name].per_cpu_s.append(produced / used)
    return out


def kv_mib(model: Path, kv: str) -> float:
    """The planner's KV arithmetic for the whole 8k context (llama-server logs no KV size at its default verbosity)."""
    return kv_bytes(load_spec(model), 8192, {"f16": "fp16", "q8_0": "q8_0"}[kv]) / 2**20  # type: ignore[arg-type]


async def kv_types(servers: Sequence[Server], rounds: int, model: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    async with httpx.AsyncClient(timeout=900) as client:
        samples = {s.name: Sample() for s in servers}
        prompt_n: dict[str, int] = {}
        prompt = [{"role": "user", "content": KV_PROMPT + "\nWhich sensor read the most?"}]
        for i in range(rounds):
            for s in servers:
                # a different first token each round, so the prompt is computed again, not reused from the slot
                cpu = cpu_seconds(s)
                t = await chat(client, s, [{"role": "user", "content": f"Run {i}. " + prompt[0]["content"]}], 64,
                               ignore_eos=True)
                samples[s.name].per_cpu_s.append((t["prompt_n"] + t["predicted_n"]) / max(1e-9, cpu_seconds(s) - cpu))
                _record(samples[s.name], t)
                samples[s.name].aggregate.append(t["prompt_n"] / t["prompt_ms"] * 1000)
                prompt_n[s.name] = int(t["prompt_n"])
        for s in servers:
            assert s.proc is not None and s.log is not None
            out[s.name] = {"kv_mib": kv_mib(model, s.name), "rss_mib": psutil.Process(s.proc.pid).memory_info().rss / 2**20,
                           "decode": statistics.median(samples[s.name].decode),
                           "prefill": statistics.median(samples[s.name].aggregate),
                           "tokens_per_cpu_s": statistics.median(samples[s.name].per_cpu_s),
                           "prompt_tokens": prompt_n[s.name]}
    return out


async def prompt_cache(servers: Sequence[Server], rounds: int) -> dict[str, Sample]:
    out = {s.name: Sample() for s in servers}
    async with httpx.AsyncClient(timeout=600) as client:
        for i in range(rounds * 2):
            doc = DOCUMENTS[i % 2]
            question = QUESTIONS[(i // 2) % len(QUESTIONS)]
            for s in servers:
                started = time.perf_counter()
                t = await chat(client, s, [{"role": "user", "content": f"{doc}\n\n{question}"}], 1)
                if i >= 2:  # the first visit of each document computes it whatever the cache
                    out[s.name].ttft_ms.append((time.perf_counter() - started) * 1000)
                    _record(out[s.name], t)
    return out


def _med(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=160, help="max tokens per speculation request")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--only", choices=("speculation", "kv", "cache"), action="append")
    args = parser.parse_args(argv)
    model = embedded_model_path()
    workdir = Path("/tmp") / f"enginegate-features-{int(time.time())}"
    workdir.mkdir(parents=True)
    only = set(args.only or ("speculation", "kv", "cache"))
    results: dict[str, Any] = {"machine": "2 vCPUs shared with five other developers' work; one thread per server",
                               "rounds": args.rounds}
    base = {"threads": 1, "parallel": 4, "context_length": 4 * 1024, "extra_args": ["--kv-unified"], "cache_ram_mib": 0}
    if "speculation" in only:
        servers = [Server(mode, {**base, "spec_type": mode}) for mode in ("none", "ngram-mod", "ngram-simple")]
        try:
            start(servers, model, workdir)
            spec = asyncio.run(speculation(servers, args.rounds, args.tokens))
        finally:
            stop_all(servers)
        print("| workload | streams | none: tok/CPU-s, tok/s | ngram-mod: tok/CPU-s (ratio), tok/s (ratio), accepted "
              "| ngram-simple: tok/CPU-s (ratio), tok/s (ratio), accepted |")
        print("|---|---|---|---|---|")
        rows = {}
        for key, table in spec.items():
            label, streams = key.split("/")
            cpu_none, wall_none = _med(table["none"].per_cpu_s), _med(table["none"].aggregate)
            cells = []
            for mode in ("ngram-mod", "ngram-simple"):
                s = table[mode]
                rate = s.accepted / s.drafted if s.drafted else 0.0
                cpu, wall = _med(s.per_cpu_s), _med(s.aggregate)
                cells.append(f"{cpu:.1f} ({cpu / cpu_none:.2f}x), {wall:.1f} ({wall / wall_none:.2f}x), "
                             f"{rate:.0%} of {s.drafted}")
            rows[key] = {m: {"tokens_per_cpu_s": _med(table[m].per_cpu_s), "tokens_per_s": _med(table[m].aggregate),
                             "engine_decode_tokens_per_s": _med(table[m].decode), "drafted": table[m].drafted,
                             "accepted": table[m].accepted} for m in table}
            print(f"| {label} | {streams} | {cpu_none:.1f}, {wall_none:.1f} | {cells[0]} | {cells[1]} |")
        results["speculation"] = rows
    if "kv" in only:
        kv_base = {"threads": 1, "parallel": 1, "context_length": 8192, "cache_ram_mib": 0}
        servers = [Server(kv, {**kv_base, "kv_cache_type": kv}) for kv in ("f16", "q8_0")]
        try:
            start(servers, model, workdir)
            kv = asyncio.run(kv_types(servers, 2, model))
        finally:
            stop_all(servers)
        print("\n| KV at 8k context | KV MiB (planner) | RSS MiB | prefill tok/s | decode tok/s (at the prompt's depth) | "
              "prompt + output tokens per CPU-s |")
        print("|---|---|---|---|---|---|")
        for name, row in kv.items():
            print(f"| {name} | {row['kv_mib']:.0f} | {row['rss_mib']:.0f} | {row['prefill']:.0f} | {row['decode']:.1f} | "
                  f"{row['tokens_per_cpu_s']:.0f} |")
        results["kv"] = kv
    if "cache" in only:
        cache_base = {"threads": 1, "parallel": 1, "context_length": 4096, "extra_args": ["--kv-unified"]}
        servers = [Server("cache-ram-0", {**cache_base, "cache_ram_mib": 0}),
                   Server("cache-ram-1024", {**cache_base, "cache_ram_mib": 1024, "cache_reuse": 256})]
        try:
            start(servers, model, workdir)
            cache = asyncio.run(prompt_cache(servers, args.rounds))
        finally:
            stop_all(servers)
        print("\n| prompt cache (1 slot, 2 documents in turn) | TTFT ms (median) | prompt ms (engine) | prompt tokens reused |")
        print("|---|---|---|---|")
        off = _med(cache["cache-ram-0"].ttft_ms)
        for name, s in cache.items():
            print(f"| {name} | {_med(s.ttft_ms):.0f} ({_med(s.ttft_ms) / off:.2f}x) | {_med(s.prompt_ms):.0f} | "
                  f"{_med([float(c) for c in s.cached]):.0f} |")
        results["prompt_cache"] = {n: {"ttft_ms": _med(s.ttft_ms), "prompt_ms": _med(s.prompt_ms),
                                       "cached_tokens": _med([float(c) for c in s.cached])} for n, s in cache.items()}
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
