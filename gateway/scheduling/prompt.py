"""A prompt's length in tokens before the engine sees it: token ids counted, text estimated.

Estimated, not tokenized: a round trip to the engine's tokenizer would cost more than the
scheduling decision is worth. English text runs ~4 characters a token for the BPE vocabularies
in use (SmolLM2, Llama, Qwen); the prefill budget only needs the order of magnitude."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CHARS_PER_TOKEN = 4
PER_MESSAGE = 4
"""Tokens a chat template adds around each message (role markers, separators)."""


def _text_chars(value: Any) -> tuple[int, int]:
    """(characters of text, token ids) in a content value: a string, token ids, or a list of parts."""
    if isinstance(value, str):
        return len(value), 0
    if isinstance(value, list):
        if value and all(isinstance(v, int) for v in value):
            return 0, len(value)
        chars = ids = 0
        for part in value:
            if isinstance(part, Mapping):
                part = part.get("text", part.get("content", ""))
            c, i = _text_chars(part)
            chars, ids = chars + c, ids + i
        return chars, ids
    return 0, 0


def prompt_tokens(body: Mapping[str, Any]) -> int:
    """Chat `messages`, Anthropic `system`, Responses/embeddings `input`, completions `prompt`."""
    chars = ids = extra = 0
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if isinstance(message, Mapping):
                c, i = _text_chars(message.get("content"))
                chars, ids, extra = chars + c, ids + i, extra + PER_MESSAGE
    for key in ("system", "input", "prompt", "instructions"):
        c, i = _text_chars(body.get(key))
        chars, ids = chars + c, ids + i
    return ids + extra + -(-chars // CHARS_PER_TOKEN)
