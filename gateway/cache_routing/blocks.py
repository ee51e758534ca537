"""A prompt as chained block hashes: the text the engine's prompt is made of, cut into fixed-size
character blocks, block i's hash covering blocks 0..i.

Two requests share a leading run of hashes exactly as long as their texts share whole leading
blocks, so a replica's index of hashes answers "how much of this prompt is cached there" with one
lookup per block and no tokenizer (characters stand in for tokens; the tracker learns each
replica's characters per token from the usage its engine reports). The text is the request view's
turns in order (gateway/request_view), each its role, its content's text (an image's bytes are not
read) and its tool calls' JSON: what a chat template renders, in the same order, so a shared message
prefix is a shared token prefix.
"""

from __future__ import annotations

import hashlib

import orjson

from gateway.request_view import RequestView

BLOCK_CHARS = 64
"""About 16 tokens of English: a turn's new message is a few blocks, a document hundreds."""
MAX_CHARS = 1 << 20
"""Only a prompt's first MiB of text is cut into blocks (about 250k tokens, past any engine's context here):
hashing runs on the event loop, and one client's oversized prompt must neither stall the others nor flush
the replicas' indexes of what their conversations hold."""


def prompt_text(view: RequestView) -> str | None:
    """The whole prompt's text in the order the engine sees it; None when the request has none."""
    if view.turns:
        return "".join(f"{t.role}\x1f{t.text}{t.calls}\x1e" for t in view.turns) or None
    if len(view.prompts) == 1:
        prompt = view.prompts[0]
        if isinstance(prompt, str):
            return prompt or None
        return orjson.dumps(list(prompt)).decode()  # token ids: one "character" each
    if view.prompts:
        return orjson.dumps([p if isinstance(p, str) else list(p) for p in view.prompts]).decode()
    return None


def chain(text: str, block_chars: int = BLOCK_CHARS) -> tuple[int, ...]:
    """The chained hashes of `text`'s whole blocks, up to `MAX_CHARS` (a last partial block is not cached
    as a block by the engines either: vLLM and SGLang reuse whole pages, llama-server's reuse is per token)."""
    hashes: list[int] = []
    previous = b""
    for start in range(0, min(len(text), MAX_CHARS) - block_chars + 1, block_chars):
        digest = hashlib.blake2b(previous + text[start:start + block_chars].encode(), digest_size=8).digest()
        hashes.append(int.from_bytes(digest, "big"))
        previous = digest
    return tuple(hashes)


def shared(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """How many leading blocks two chains share (chained: the first difference ends the run)."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
