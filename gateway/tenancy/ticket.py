"""One admitted request's account: what admission charged, what the request used when it ended.

The serving flow records usage on it (sync, no I/O); the auth middleware settles it once, when
the response ends, the client leaves or the app fails."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.tenancy.limits import Decision, Limits


@dataclass(slots=True)
class Ticket:
    name: str
    model: str
    limits: Limits | None = None
    decision: Decision | None = None
    """The admission decision (None: the key has no limits, or the store was down and fails open)."""
    charged: int = 0
    """Tokens reserved at admission: the prompt's estimate plus the most its completions can be."""
    estimate: int = 0
    """The prompt's estimate, the part of `charged` that stands for the prompt until the engine counts it."""
    prompt_tokens: int | None = None
    completion_tokens: int = 0
    streamed_events: int = 0
    failed: bool = False
    request_id: str = ""
    """The id its reserve and settle carry (the gateway's own, never the client's x-request-id)."""
    lease_id: str = ""
    """The concurrency lease it holds: its own reserve's id, or a lease this process kept from an earlier request
    of the key (service.py); "" for none."""
    settled: bool = False

    def record(self, prompt_tokens: int | None, completion_tokens: int | None) -> None:
        if prompt_tokens is not None:
            self.prompt_tokens = prompt_tokens
        if completion_tokens is not None:
            self.completion_tokens = completion_tokens

    @property
    def prompt_used(self) -> int:
        """The engine's count, else the estimate."""
        return self.estimate if self.prompt_tokens is None else self.prompt_tokens

    def token_delta(self) -> int:
        """Tokens to add at the end, what was used minus what was reserved: negative (a refund) when
        the request used less; a stream the client left without a usage event counts one token per
        content event it received."""
        return self.prompt_used + (self.completion_tokens or self.streamed_events) - self.charged
