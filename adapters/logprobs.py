"""Token log-probabilities in OpenAI's two shapes, from raw logits.

Pure functions over numpy arrays and token texts; the in-process engine feeds them. Written here
rather than taken from llama-cpp-python: its `echo` scoring pairs each token with the logits *at*
its own position (those predict the next token: every score is off by one) and sorts the whole
vocabulary in Python once per token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MAX_TOP_LOGPROBS = 20
"""OpenAI's ceiling for chat `top_logprobs`; completions' legacy `logprobs` allows 5 (we allow 20, as vLLM)."""


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64 (a float32 sum over a 50k vocabulary loses the 1e-3 scorers compare at)."""
    x = np.asarray(logits, dtype=np.float64)
    top = np.max(x, axis=-1, keepdims=True)
    shifted = x - np.where(np.isfinite(top), top, 0.0)
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def top_k(row: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The k most likely (token id, logprob) of one row, best first (ties: the lower id first)."""
    if k <= 0:
        return []
    k = min(k, row.shape[0])
    ids = np.argpartition(-row, k - 1)[:k]
    ids = ids[np.lexsort((ids, -row[ids]))]
    return [(int(i), float(row[i])) for i in ids]


@dataclass(slots=True)
class TokenLogprob:
    """One token of a sequence: its id, its logprob (None for a prompt's first token: nothing predicts it)
    and the k best alternatives at its position."""

    token: int
    logprob: float | None
    top: list[tuple[int, float]] = field(default_factory=list)


def score(tokens: Sequence[int], logits: np.ndarray, k: int) -> list[TokenLogprob]:
    """Each token's logprob given the tokens before it: `logits[i]` (the engine's output after token i)
    predicts token i + 1; the first token has none (OpenAI's `echo` convention: null)."""
    out = [TokenLogprob(int(tokens[0]), None)] if len(tokens) else []
    if len(tokens) < 2:
        return out
    rows = log_softmax(logits[: len(tokens) - 1])
    nxt = np.asarray(tokens[1:], dtype=np.int64)
    picked = rows[np.arange(len(nxt)), nxt]
    for i, t in enumerate(nxt):
        out.append(TokenLogprob(int(t), float(picked[i]), top_k(rows[i], k)))
    return out


def legacy(items: Sequence[TokenLogprob], texts: Sequence[str], alt_text: dict[int, str], start: int = 0) -> dict[str, Any]:
    """Completions' shape: `tokens`, `token_logprobs`, `top_logprobs` (token text -> logprob, the chosen
    token included, as OpenAI did) and `text_offset` (each token's start in the returned text, from `start`)."""
    offsets, offset = [], start
    for text in texts:
        offsets.append(offset)
        offset += len(text)
    tops: list[dict[str, float] | None] = []
    for item, text in zip(items, texts, strict=True):
        if item.logprob is None:
            tops.append(None)
            continue
        top = {alt_text[i]: lp for i, lp in item.top}
        top.setdefault(text, item.logprob)
        tops.append(top)
    return {"tokens": list(texts), "token_logprobs": [i.logprob for i in items], "top_logprobs": tops,
            "text_offset": offsets}


def _entry(text: str, raw: bytes, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": logprob, "bytes": list(raw)}


def chat(items: Sequence[TokenLogprob], raw: Sequence[bytes], alt_raw: dict[int, bytes], k: int) -> dict[str, Any]:
    """Chat's shape: `{"content": [{token, logprob, bytes, top_logprobs: [...]}], "refusal": null}`."""
    content = []
    for item, piece in zip(items, raw, strict=True):
        lp = item.logprob if item.logprob is not None else 0.0
        entry = _entry(piece.decode("utf-8", "replace"), piece, lp)
        entry["top_logprobs"] = [_entry(alt_raw[i].decode("utf-8", "replace"), alt_raw[i], v) for i, v in item.top[:k]]
        content.append(entry)
    return {"content": content, "refusal": None}


def keep_within(items: list[TokenLogprob], texts: list[str], length: int) -> int:
    """How many of the generated tokens lie in a text of `length` characters (the engine cut a stop
    sequence, or held back an end token): those starting before the end."""
    offset = 0
    for n, text in enumerate(texts):
        if offset >= length and text:
            return n
        offset += len(text)
    return len(items)


def legacy_from_chat(content: Sequence[dict[str, Any]], k: int, start: int = 0) -> dict[str, Any]:
    """llama-server's completions logprobs (chat's `content` list: token, logprob, top_logprobs) in the legacy shape."""
    tokens = [str(e.get("token", "")) for e in content]
    offsets, offset = [], start
    for text in tokens:
        offsets.append(offset)
        offset += len(text)
    tops: list[dict[str, float] | None] = []
    for e, text in zip(content, tokens, strict=True):
        top = {str(t.get("token", "")): float(t.get("logprob", 0.0)) for t in (e.get("top_logprobs") or [])[:k]}
        top.setdefault(text, float(e.get("logprob", 0.0)))
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": [float(e.get("logprob", 0.0)) for e in content], "top_logprobs": tops,
            "text_offset": offsets}
