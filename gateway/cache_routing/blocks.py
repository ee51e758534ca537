"""A prompt as chained block hashes: the text the engine's prompt is made of, cut into fixed-size
character blocks, block i's hash covering blocks 0..i.

Two requests share a leading run of hashes exactly as long as their texts share whole leading
blocks, so a replica's index of hashes answers "how much of this prompt is cached there" with one
lookup per block and no tokenizer (characters stand in for tokens; the tracker learns each
replica's characters per token from the usage its engine reports). The text is the messages in
order, each its role and its content's text (an image's bytes are not read), then the tools: what
a chat template renders, in the same order, so a shared message prefix is a shared token prefix.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

BLOCK_CHARS = 64
"""About 16 tokens of English: a turn's new message is a few blocks, a document hundreds."""
MAX_CHARS = 1 << 20
"""Only a prompt's first MiB of text is cut into blocks (about 250k tokens, past any engine's context here):
hashing runs on the event loop, and one client's oversized prompt must neither stall the others nor flush
the replicas' indexes of what their conversations hold."""


def content_text(content: Any) -> str:
    """A message's content as text: a string, the text parts of a list (an image's bytes are not read), else JSON."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return "" if content is None else orjson.dumps(content, option=orjson.OPT_SORT_KEYS).decode()


def prompt_text(body: Mapping[str, Any]) -> str | None:
    """The whole prompt's text in the order the engine sees it; None when the body has none."""
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        parts = [f"{m.get('role')}\x1f{content_text(m.get('content'))}{content_text(m.get('tool_calls'))}\x1e"
                 for m in messages if isinstance(m, dict)]
        return "".join(parts) or None
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = prompt[0] if prompt and len(prompt) == 1 else (prompt or None)
    if isinstance(prompt, str):
        return prompt or None
    if isinstance(prompt, list):  # token ids: one "character" each
        return orjson.dumps(prompt).decode()
    text = body.get("input")  # the Responses API before translation
    return content_text(text) or None


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
