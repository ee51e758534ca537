"""The key a request offers the balancer: its session (a header, else the body's `user`) and a prefix hash.

The prefix hash covers the prompt's leading turns up to and including the first user message
(at most `prefix_chars` characters of it): what stays the same across a conversation's turns,
since each turn resends the conversation so far. Two conversations with one system prompt but
different first questions get different keys; a prompt shared by every request is one hot key,
which the bounded load spreads. A text completion's prompt has no turns to tell apart: its key is
its first `PROMPT_CHARS` characters (a prompt that grows turn by turn keeps its start); a token-id
prompt's, its first ids. Read from the request's view (gateway/request_view), never the body.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import orjson

from gateway.request_view import RequestView
from gateway.routing.pool import RouteKey

MAX_SESSION = 256
PROMPT_CHARS = 1024


def prefix_text(view: RequestView, limit: int) -> str | None:
    """The leading text a conversation keeps across turns; None when the request has no prompt."""
    if view.turns:
        parts: list[str] = []
        size = 0
        for turn in view.turns:
            part = f"{turn.role}\x1f{turn.text}\x1e"
            parts.append(part)
            size += len(part)
            if turn.role == "user" or size >= limit:
                break
        return "".join(parts)[:limit] or None
    if not view.prompts:
        return None
    prompt, limit = view.prompts[0], min(limit, PROMPT_CHARS)
    if isinstance(prompt, str):
        return prompt[:limit] or None
    return orjson.dumps(list(prompt[:limit])).decode()  # token ids


def route_key(view: RequestView, headers: Mapping[str, str], session_header: str, prefix_chars: int) -> RouteKey:
    session = headers.get(session_header.lower()) or view.user
    text = prefix_text(view, prefix_chars)
    prefix = hashlib.blake2b(text.encode(), digest_size=16).hexdigest() if text else None
    return RouteKey(session=session[:MAX_SESSION] if session else None, prefix=prefix)
