"""The key a request offers the balancer: its session (a header, else the body's `user`) and a prefix hash.

The prefix hash covers the prompt's leading messages up to and including the first user message
(at most `prefix_chars` characters of it): what stays the same across a conversation's turns,
since each turn resends the conversation so far. Two conversations with one system prompt but
different first questions get different keys; a prompt shared by every request is one hot key,
which the bounded load spreads. A text completion's prompt has no turns to tell apart: its key is
its first `PROMPT_CHARS` characters (a prompt that grows turn by turn keeps its start).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

from gateway.cache_routing.blocks import content_text
from gateway.routing.pool import RouteKey

MAX_SESSION = 256
PROMPT_CHARS = 1024


def prefix_text(body: Mapping[str, Any], limit: int) -> str | None:
    """The leading text a conversation keeps across turns; None when the body has no prompt."""
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        parts: list[str] = []
        size = 0
        for message in messages:
            if not isinstance(message, dict):
                continue
            part = f"{message.get('role')}\x1f{content_text(message.get('content'))}\x1e"
            parts.append(part)
            size += len(part)
            if message.get("role") == "user" or size >= limit:
                break
        return "".join(parts)[:limit] or None
    prompt = body.get("prompt")
    limit = min(limit, PROMPT_CHARS)
    if isinstance(prompt, list):
        prompt = prompt[0] if prompt else None
    if isinstance(prompt, str):
        return prompt[:limit] or None
    if isinstance(prompt, list):  # token ids
        return orjson.dumps(prompt[:limit]).decode()
    instructions = body.get("input")  # the Responses API before translation
    return content_text(instructions)[:limit] or None


def route_key(body: Mapping[str, Any], headers: Mapping[str, str], session_header: str, prefix_chars: int) -> RouteKey:
    session = headers.get(session_header.lower()) or (body.get("user") if isinstance(body.get("user"), str) else None)
    text = prefix_text(body, prefix_chars)
    prefix = hashlib.blake2b(text.encode(), digest_size=16).hexdigest() if text else None
    return RouteKey(session=session[:MAX_SESSION] if session else None, prefix=prefix)
