"""A prompt's length in tokens before the engine sees it, as the scheduler's prefill budget reads it:
the request view's estimate (gateway/request_view), the one every part of the gateway charges.

Estimated, not tokenized: a round trip to the engine's tokenizer would cost more than the
scheduling decision is worth; the prefill budget only needs the order of magnitude."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.request_view import RequestView, view_of


def prompt_tokens(request: RequestView | Mapping[str, Any]) -> int:
    """The view's estimate; a body (classify.demand_for passes one) is viewed first."""
    view = request if isinstance(request, RequestView) else view_of(request)
    return view.prompt_tokens
