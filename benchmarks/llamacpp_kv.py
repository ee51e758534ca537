"""The in-process llama.cpp engine's KV cache types against each other: prefill and decode speed, and how
far greedy output agrees with f16 KV, on the embedded model (SmolLM2-135M), in one run.

    python -m benchmarks.llamacpp_kv [--rounds 3] [--prompts 6] [--prompt-words 600] [--tokens 64] [--json FILE]

Each variant is a `Llama` loaded with the arguments the adapter passes for its `kv_cache_type`
(adapters/llamacpp_kv.py: type_k/type_v, flash attention for q8_0 and q4_0), one thread, all loaded at once
and given the same prompts in turn (f16, q8_0, q4_0, f16, ...), so the machine's noise falls on each alike.
Prefill: prompt tokens over the time to evaluate them; decode: the greedy tokens after it over their time.
Agreement: of the greedy tokens, the share equal to f16's at the same position up to the first difference
(a token after a difference continues another text), and how many prompts gave f16's whole answer.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import llama_cpp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.llamacpp_kv import llama_kwargs  # noqa: E402
from gateway.bench.workload import synthetic_prompt  # noqa: E402
from gateway.modelsource import embedded_model_path  # noqa: E402

KINDS = ("f16", "q8_0", "q4_0")


def greedy(llm: llama_cpp.Llama, prompt: list[int], tokens: int) -> tuple[float, float, list[int]]:
    """(prefill seconds, decode seconds, the greedy tokens) for one prompt on a cleared cache."""
    llm.reset()
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm._ctx.ctx), True)
    started = time.perf_counter()
    llm.eval(prompt)
    prefilled = time.perf_counter()
    out: list[int] = []
    for _ in range(tokens):
        token = int(llm.sample(temp=0.0))
        out.append(token)
        if token == llm.token_eos():
            break
        llm.eval([token])
    return prefilled - started, time.perf_counter() - prefilled, out


def agreement(mine: list[int], reference: list[int]) -> int:
    same = 0
    for a, b in zip(mine, reference):
        if a != b:
            break
        same += 1
    return same


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompts", type=int, default=6, help="different prompts per round")
    p.add_argument("--prompt-words", type=int, default=600)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    path = str(embedded_model_path())
    models = {k: llama_cpp.Llama(model_path=path, n_ctx=args.context, n_threads=args.threads,
                                 n_threads_batch=args.threads, n_batch=512, verbose=False, **llama_kwargs(k))
              for k in KINDS}
    ref = models["f16"]
    prompts = []
    for i in range(args.prompts):
        text = ("Summarise the following notes in two sentences.\n\n"
                + synthetic_prompt(random.Random(f"kv:{i}"), args.prompt_words))
        prompts.append(ref.tokenize(text.encode()))
    rows: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for i, prompt in enumerate(prompts):
            order = KINDS if (r + i) % 2 == 0 else KINDS[::-1]
            for kind in order:
                prefill, decode, out = greedy(models[kind], prompt, args.tokens)
                rows.append({"kv": kind, "round": r, "prompt": i, "prompt_tokens": len(prompt), "prefill_s": prefill,
                             "decode_s": decode, "tokens": out})
    for model in models.values():
        model.close()
    reference = {(x["round"], x["prompt"]): x["tokens"] for x in rows if x["kv"] == "f16"}
    summary = {}
    for kind in KINDS:
        mine = [x for x in rows if x["kv"] == kind]
        same = [agreement(x["tokens"], reference[(x["round"], x["prompt"])]) for x in mine]
        whole = sum(x["tokens"] == reference[(x["round"], x["prompt"])] for x in mine)
        summary[kind] = {
            "prefill_tps": statistics.median(x["prompt_tokens"] / x["prefill_s"] for x in mine),
            "decode_tps": statistics.median(len(x["tokens"]) / x["decode_s"] for x in mine if x["tokens"]),
            "agree_tokens": sum(same) / max(1, sum(len(x["tokens"]) for x in mine)),
            "identical": f"{whole}/{len(mine)}",
        }
    print(f"embedded SmolLM2-135M, -c {args.context}, {args.threads} thread(s); {args.prompts} prompts of "
          f"~{len(prompts[0])} tokens x {args.rounds} rounds, {args.tokens} greedy tokens each, interleaved\n")
    print("| KV | prefill tok/s (vs f16) | decode tok/s (vs f16) | greedy tokens equal to f16's before a difference | "
          "answers identical to f16's |")
    print("|---|---|---|---|---|")
    base = summary["f16"]
    for kind, s in summary.items():
        print(f"| {kind} | {s['prefill_tps']:.0f} ({s['prefill_tps'] / base['prefill_tps']:.2f}x) | "
              f"{s['decode_tps']:.1f} ({s['decode_tps'] / base['decode_tps']:.2f}x) | {s['agree_tokens']:.0%} | "
              f"{s['identical']} |")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "summary": summary,
                                         "runs": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
