"""What the gateway learns about one API request while it runs, and the row it becomes.

`MetricsMiddleware` puts one `RequestFacts` in the scope's state for each recorded route; the
serving flow fills in what it learns (the replica that served it, the first and last token, the
usage, the finish reason) with plain attribute writes; the middleware finishes it once, after
the last byte (or when the client left), and hands it to the ring. A finished record is never
written again, so readers (the admin routes, the live stream) build rows from it at any time.

Never in a record: the key, its hash, or any of the prompt's or answer's text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from starlette.types import Scope

FACTS_STATE_KEY = "enginegate.facts"
CLIENT_CLOSED = 499
RECORDED_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/messages"})
"""The API requests a record is kept for (token counting and the admin routes are not requests for work)."""
FACT_HEADERS = (b"x-enginegate-engine", b"x-enginegate-replica", b"x-enginegate-queue-ms", b"x-enginegate-request-id")
_FINISH = re.compile(rb'"finish_reason"\s*:\s*"([a-z_]{1,32})"')


@dataclass(slots=True, eq=False)
class RequestFacts:
    id: str
    created: float
    """Wall-clock seconds (UTC epoch) when the request arrived."""
    endpoint: str
    started: float
    """perf_counter() at arrival: every other instant below is on that clock."""
    engine: str | None = None
    replica: str | None = None
    admitted: float | None = None
    """When its last admission gave it a slot (a retry on another replica admits again)."""
    stream: bool = False
    first_token: float | None = None
    last_token: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    engine_prefill_s: float | None = None
    """The engine's own prefill time, where it reports one (llama-server's timings.prompt_ms)."""
    finish_reason: str | None = None
    abandoned: bool = False
    """The client left before the end of the answer."""
    # set once, when the request ends
    status: int = 0
    tenant: str | None = None
    model: str | None = None
    queue_s: float = 0.0
    total_s: float = 0.0
    trace_id: str | None = None

    def headers(self, queued_s: float) -> list[tuple[bytes, bytes]]:
        """The response facts headers (the engine and replica once a replica was chosen)."""
        if self.admitted is None:  # refused before a replica was chosen
            return [(b"x-enginegate-request-id", self.id.encode("latin-1"))]
        return [(b"x-enginegate-request-id", self.id.encode("latin-1")),
                (b"x-enginegate-engine", (self.engine or "").encode("latin-1", "replace")),
                (b"x-enginegate-replica", (self.replica or "").encode("latin-1", "replace")),
                (b"x-enginegate-queue-ms", b"%.3f" % (queued_s * 1000))]

    def usage(self, prompt: int, completion: int, cached: int | None, prefill_s: float | None) -> None:
        self.prompt_tokens, self.completion_tokens, self.cached_tokens = prompt, completion, cached
        self.engine_prefill_s = prefill_s

    def row(self) -> dict[str, Any]:
        """The row of the console seam (docs/console.md): times in milliseconds, None where not known.

        A stream: ttft from arrival to the first token, prefill from its slot to the first token, decode from
        the first token to the last. A whole answer: prefill as the engine reports it (else None), decode the
        rest of the engine's time after it (None without the engine's prefill), ttft None (nothing was seen
        before the end)."""
        ttft = prefill = decode = None
        if self.first_token is not None:
            ttft = _ms(self.first_token - self.started)
            if self.admitted is not None:
                prefill = _ms(self.first_token - self.admitted)
            if self.last_token is not None:
                decode = _ms(self.last_token - self.first_token)
        elif not self.stream and self.engine_prefill_s is not None and self.admitted is not None:
            prefill = _ms(self.engine_prefill_s)
            engine_s = self.started + self.total_s - self.admitted - self.engine_prefill_s
            decode = _ms(max(0.0, engine_s))
        return {
            "id": self.id, "created": round(self.created, 3), "tenant": self.tenant, "model": self.model,
            "endpoint": self.endpoint, "status": self.status, "engine": self.engine, "replica": self.replica,
            "stream": self.stream, "queue_ms": _ms(self.queue_s) if self.admitted is not None else None,
            "ttft_ms": ttft, "prefill_ms": prefill, "decode_ms": decode, "total_ms": _ms(self.total_s),
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens, "finish_reason": self.finish_reason, "trace_id": self.trace_id,
        }


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


_DETACHED: dict[str, Any] = {}


def request_facts(scope: Scope) -> RequestFacts | None:
    """The request's record, or None where the middleware keeps none (another route, or a test's bare app)."""
    facts = scope.get("state", _DETACHED).get(FACTS_STATE_KEY)
    return facts if isinstance(facts, RequestFacts) else None


def finish_of(body: dict[str, Any] | bytes) -> str | None:
    """The first choice's finish_reason of a whole answer (chat, completions), or a Responses object's
    status; a relayed body is searched, not parsed (it is passed on as the engine's bytes)."""
    if isinstance(body, bytes):
        found = _FINISH.search(body)
        return found.group(1).decode() if found else None
    choices = body.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        reason = choices[0].get("finish_reason")
        return reason if isinstance(reason, str) else None
    status = body.get("stop_reason", body.get("status"))
    return status if isinstance(status, str) else None
