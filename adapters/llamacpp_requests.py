"""Requests to llama-cpp-python, and its failures, in the gateway's terms."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from adapters.base import ClientRequestError, EngineError, UnsupportedError
from adapters.error_codes import CONTEXT_LENGTH_EXCEEDED


def text_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Content parts joined into text, no content (an assistant's tool calls) as "": llama-cpp-python's
    chat templates concatenate the content as a string."""
    out = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if content is None:
            message = {**message, "content": ""}
        elif isinstance(content, list):
            kinds = {part.get("type") for part in content} - {"text"}
            if kinds:
                raise UnsupportedError(f"content parts of type {', '.join(sorted(map(str, kinds)))} are not supported "
                                       "by the llamacpp engine (text only)", f"messages.{i}.content")
            message = {**message, "content": "\n".join(str(part.get("text", "")) for part in content)}
        out.append(message)
    return out


def translator(prefix: str) -> Callable[[BaseException], BaseException]:
    def translate(exc: BaseException) -> BaseException:
        if isinstance(exc, (UnsupportedError, EngineError, ClientRequestError)):
            return exc
        param = "messages" if prefix == "chatcmpl" else "prompt"
        if isinstance(exc, ValueError) and "context window" in str(exc):  # "Requested tokens (n) exceed context window of m"
            return ClientRequestError(str(exc), 400, param, CONTEXT_LENGTH_EXCEEDED)
        if isinstance(exc, ValueError):
            return UnsupportedError(str(exc), param)
        return EngineError(f"llama.cpp generation failed: {exc}")

    return translate


def chat_logprobs_k(body: dict[str, Any]) -> int | None:
    """Chat's `logprobs: true` (+ `top_logprobs`: alternatives per token) as the k to record; None: off."""
    if not body.get("logprobs"):
        if body.get("top_logprobs"):
            raise UnsupportedError("top_logprobs needs logprobs: true", "top_logprobs")
        return None
    return int(body.get("top_logprobs") or 0)


def completion_logprobs_k(body: dict[str, Any]) -> int | None:
    """Completions' legacy `logprobs` (an integer: alternatives per token; 0 the chosen token's alone); None: off."""
    value = body.get("logprobs")
    return None if value is None or value is False else int(value)
