"""Checks of a request against the model that will serve it, before the engine sees it.

The request models (protocol.py) check what holds for every model; this checks what depends on
the model: token ids inside its vocabulary, token-id prompts that fit its context, and output
limits the model can honour (never over its context, never past an engine's 32-bit counter,
where 2**32-1 wraps to -1, "no limit"). The facts
come from the adapter's `describe()` (`vocab_size`, `context_length`); a fact an engine does not
report is not checked here (that engine checks it and answers 4xx, which is relayed).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from gateway.api.errors import APIError

INT32_MAX = 2**31 - 1
OUTPUT_LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def _token_lists(value: Any) -> Iterator[list[int]]:
    if isinstance(value, list) and value:
        if isinstance(value[0], int):
            yield value
        elif isinstance(value[0], list):
            yield from value


def check_token_ids(value: Any, param: str, facts: Mapping[str, Any]) -> None:
    """400 (with `param`) for a token id outside the vocabulary or a token list over the context."""
    vocab = facts.get("vocab_size")
    context = facts.get("context_length")
    for ids in _token_lists(value):
        if isinstance(vocab, int) and vocab > 0:
            bad = next((t for t in ids if not 0 <= t < vocab), None)
            if bad is not None:
                raise APIError(400, f"{param}: token id {bad} is outside the model's vocabulary [0, {vocab})",
                               param=param, code="invalid_token_id")
        if isinstance(context, int) and context > 0 and len(ids) >= context:
            raise APIError(400, f"{param}: {len(ids)} tokens do not fit the model's context of {context} tokens",
                           param=param, code="context_length_exceeded")


def check_output_limits(body: Mapping[str, Any], facts: Mapping[str, Any]) -> None:
    """400 (with `param`) for an output limit the model cannot honour: over its context, or over int32."""
    context = facts.get("context_length")
    for param in OUTPUT_LIMITS:
        limit = body.get(param)
        if not isinstance(limit, int) or isinstance(limit, bool):
            continue
        if limit > INT32_MAX:
            raise APIError(400, f"{param}: {limit} is above the largest accepted value, {INT32_MAX}",
                           param=param, code="integer_above_max_value")
        if isinstance(context, int) and context > 0 and limit > context:
            raise APIError(400, f"{param}: {limit} tokens do not fit the model's context of {context} tokens "
                                "(prompt and output share it)", param=param, code="context_length_exceeded")
