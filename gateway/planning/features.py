"""The engine's own speed-ups, chosen per workload: speculation, prefix and prompt caches, batch sizes.

Pure functions of the workload, the model, the hardware profile and the engine's declared
abilities (`EngineSpec.speculation`, `feature_options`). Each returns one `FeatureDecision`
with the reason and the figure behind it; `choose()` gathers them into the engine-neutral
`Features` that the engine's spec turns into flags. The KV cache type is decided in plan.py
(it changes the memory arithmetic, so it re-plans); format advice lives in formats.py.

The thresholds come from benchmarks/engine_features.py (docs/engine-features.md has the table).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Literal

from pydantic import BaseModel, ConfigDict

from adapters import registry
from adapters.spec import Features
from gateway.planning.capacity import Capacity
from gateway.planning.specs import ModelSpec
from gateway.planning.workload import Profile, Workload

FeatureName = Literal["speculation", "kv_cache", "prefix_cache", "prompt_cache", "batching"]

SPECULATION_MAX_STREAMS_CPU = 2
"""On a CPU speculation stays on up to 2 streams: measured on llama-server (benchmarks/engine_features.py,
docs/engine-features.md), n-gram speculation (ngram-simple) decoded edits 1.19x as many tokens per CPU-second at
1 stream and 1.15x at 2, but 0.94x at 4, where the batch already keeps the core busy and verifying drafts
takes compute from the other sequences."""
SPECULATION_MAX_STREAMS_GPU = 4
"""On a GPU, up to 4 streams: small batches leave decode bandwidth-bound, so verifying a few drafted
tokens is nearly free (not measured here: this machine has no GPU; tune measures it on the host)."""
NGRAM_TOKENS = 4
"""Tokens an n-gram lookup drafts per step (vLLM's prompt_lookup_max; llama.cpp's ngram-mod default n-max is larger)."""
MTP_TOKENS = 1
"""One draft token per MTP head: DeepSeek-V3's report accepts the second token 85-90% of the time (1.8x decode)."""
PROMPT_CACHE_SHARE = 0.25
"""Share of the RAM the plan leaves free that llama-server's host-RAM prompt cache may take."""
PROMPT_CACHE_MAX_BYTES = 8 * 2**30
"""llama-server's own default (8 GiB): never more."""
LATENCY_BATCH_TOKENS = 2048
"""Chunked-prefill budget per step for latency: a long prompt stalls the other sequences' decode
for one 2048-token chunk at most."""
THROUGHPUT_BATCH_TOKENS = (8192, 16384)
"""Budget per step for throughput: whole prompts per step, between these bounds."""


class FeatureDecision(BaseModel):
    """One of the engine's own features, decided: what (`choice`, in the engine's words) and why."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    feature: FeatureName
    choice: str
    reason: str

    def describe(self) -> str:
        return f"{self.feature} {self.choice}: {self.reason}"


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def max_streams(on_gpu: bool) -> int:
    return SPECULATION_MAX_STREAMS_GPU if on_gpu else SPECULATION_MAX_STREAMS_CPU


def speculation_pays(w: Workload, on_gpu: bool) -> bool:
    """n-gram speculation pays for this workload (where the engine has it): copied outputs, few streams, latency."""
    return w.output_copies_prompt and w.objective in ("latency", "development") and w.concurrency <= max_streams(on_gpu)


def speculation(engine: str, spec: ModelSpec, w: Workload, on_gpu: bool) -> tuple[FeatureDecision, Features]:
    modes = registry.spec(engine).speculation
    if not modes:
        return FeatureDecision(feature="speculation", choice="off",
                               reason=f"{engine} has no speculative decoding the planner can turn on"), Features()
    off = Features(speculation="off")
    if w.objective not in ("latency", "development"):
        return FeatureDecision(
            feature="speculation", choice="off",
            reason=f"objective {w.objective}: drafts verified per step cost batch throughput; speculation buys latency",
        ), off
    limit = max_streams(on_gpu)
    if w.concurrency > limit:
        where = ("on a CPU (measured: 0.94x at 4 streams)" if not on_gpu
                 else "on a GPU the batch then fills the compute that verifying drafts needs")
        return FeatureDecision(
            feature="speculation", choice="off",
            reason=f"{w.concurrency} concurrent sequences > {limit} {where}: verifying drafts costs the other "
                   "sequences' decode",
        ), off
    if spec.mtp_layers and "mtp" in modes:
        return FeatureDecision(
            feature="speculation", choice="mtp",
            reason=f"the checkpoint has {spec.mtp_layers} multi-token-prediction layer(s): {MTP_TOKENS} draft token "
                   "per head, no draft model (DeepSeek-V3 reports 85-90% acceptance, ~1.8x decode)",
        ), Features(speculation="mtp", speculative_tokens=MTP_TOKENS * spec.mtp_layers)
    if "ngram" not in modes:
        return FeatureDecision(feature="speculation", choice="off",
                               reason=f"{engine} speculates only with a draft model: name one in the model's options"), off
    if w.output_copies_prompt:
        return FeatureDecision(
            feature="speculation", choice="ngram",
            reason=f"outputs copy the prompt (output_copies_prompt) at {w.concurrency} stream(s): n-gram lookup drafts "
                   "the copied spans with no draft model (measured here on edits: 1.19x tokens per CPU-second at 1 stream, "
                   "1.15x at 2)",
        ), Features(speculation="ngram", speculative_tokens=NGRAM_TOKENS)
    return FeatureDecision(
        feature="speculation", choice="off",
        reason="free generation: n-gram lookup finds little to draft (measured here: 0.99x at 1, 2 and 4 streams); "
               "set output_copies_prompt in the workload for edits, rewrites, extraction",
    ), off


def prefix_cache(engine: str, w: Workload) -> tuple[FeatureDecision, Features]:
    if not registry.spec(engine).feature_options:
        return FeatureDecision(feature="prefix_cache", choice="engine default",
                               reason=f"{engine} has no prefix-cache option"), Features()
    if w.shared_prefix:
        return FeatureDecision(
            feature="prefix_cache", choice="on",
            reason="requests share prefixes (shared_prefix): the shared part's KV is computed once and reused",
        ), Features(prefix_cache=True)
    return FeatureDecision(feature="prefix_cache", choice="engine default",
                           reason="no shared prefixes in the workload: left as the engine ships it"), Features()


def prompt_cache(engine: str, w: Workload, cap: Capacity | None, ram_free: int | None) -> tuple[FeatureDecision, Features] | None:
    """llama-server's host-RAM prompt cache (--cache-ram), sized from the RAM the plan leaves free.

    Kept where evicted prompts recur: conversations (the next turn resends the conversation so far) or
    shared prefixes; off only for one-shot requests without shared prefixes."""
    if engine != "llama_server":
        return None
    if w.requests == "one_shot" and not w.shared_prefix:
        return FeatureDecision(
            feature="prompt_cache", choice="off",
            reason="one-shot requests without shared prefixes: evicted prompts would not recur, so the cache would "
                   "hold RAM for nothing (--cache-ram 0 instead of llama-server's 8 GiB default)",
        ), Features(prompt_cache_bytes=0)
    if ram_free is None:
        size = PROMPT_CACHE_MAX_BYTES // 8
        why = f"RAM size unknown: {size // 2**20} MiB"
    else:
        size = int(min(PROMPT_CACHE_MAX_BYTES, max(0, ram_free) * PROMPT_CACHE_SHARE)) // 2**20 * 2**20
        why = f"{PROMPT_CACHE_SHARE:.0%} of the {ram_free / 2**30:.1f} GiB of RAM the plan leaves free, at most 8 GiB"
    recurs = ("shared prefixes: prompts evicted from a slot are restored from host RAM instead of recomputed"
              if w.shared_prefix else
              "conversations: each turn resends the conversation so far, so one evicted from its slot recurs at its "
              "next turn and is restored from host RAM instead of recomputed (set requests: one_shot for "
              "independent requests)")
    return FeatureDecision(
        feature="prompt_cache", choice=f"{size // 2**20} MiB", reason=f"{recurs}; {why}",
    ), Features(prompt_cache_bytes=size)


def batching(engine: str, w: Workload, p: Profile, on_gpu: bool) -> tuple[FeatureDecision, Features]:
    """Chunked prefill's step budget (servers) or llama.cpp's batch sizes, from the workload's prompt length."""
    if engine in ("llamacpp", "llama_server"):
        if on_gpu and p.heavy == "prefill" and w.prompt_tokens > 512:
            ub = min(2048, _pow2_at_least(w.prompt_tokens))
            return FeatureDecision(
                feature="batching", choice=f"-b {max(2048, ub)} -ub {ub}",
                reason=f"prefill-heavy ({w.prompt_tokens}-token prompts) on a GPU: a {ub}-token physical batch "
                       "computes the prompt in fewer, fuller kernel launches than the default 512",
            ), Features(batch_tokens=max(2048, ub), ubatch_tokens=ub)
        where = ("on a CPU (a bigger physical batch pays where each batch is a GPU kernel launch; not measured on a "
                 "CPU)") if not on_gpu else "prompts are short"
        return FeatureDecision(feature="batching", choice="engine default",
                               reason=f"-b 2048 -ub 512 kept: {where}"), Features()
    if not registry.spec(engine).feature_options:
        return FeatureDecision(feature="batching", choice="engine default",
                               reason=f"{engine} has no batch-size option"), Features()
    if p.heavy != "prefill" or w.concurrency == 1:
        return FeatureDecision(feature="batching", choice="engine default",
                               reason="decode-led or single-stream traffic: prefill chunks do not stall other sequences"), Features()
    if w.objective in ("latency", "development"):
        tokens = LATENCY_BATCH_TOKENS
        why = (f"latency: {w.prompt_tokens}-token prompts mixed with {w.concurrency} decoding sequences are prefilled "
               f"in {tokens}-token chunks, so one prompt stalls the others' next token by one chunk at most")
    else:
        low, high = THROUGHPUT_BATCH_TOKENS
        tokens = min(high, max(low, _pow2_at_least(w.prompt_tokens)))
        why = f"{w.objective}: {tokens} tokens per step take whole {w.prompt_tokens}-token prompts with the decodes"
    return FeatureDecision(feature="batching", choice=f"{tokens} tokens per step", reason=why), Features(batch_tokens=tokens)


def choose(engine: str, spec: ModelSpec, w: Workload, p: Profile, cap: Capacity | None, ram_free: int | None,
           on_gpu: bool) -> tuple[list[FeatureDecision], Features]:
    """Every feature decision for the engine that serves, and the merged `Features`."""
    decisions: list[FeatureDecision] = []
    merged: dict[str, object] = {}
    parts = [speculation(engine, spec, w, on_gpu), prefix_cache(engine, w), prompt_cache(engine, w, cap, ram_free),
             batching(engine, w, p, on_gpu)]
    for part in parts:
        if part is None:
            continue
        decision, features = part
        decisions.append(decision)
        merged.update({f.name: getattr(features, f.name) for f in fields(Features) if getattr(features, f.name) is not None})
    return decisions, Features(**merged)  # type: ignore[arg-type]
