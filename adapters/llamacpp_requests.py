"""Requests to llama-cpp-python, and its failures, in the gateway's terms."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from adapters.base import EngineError, UnsupportedError


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
        if isinstance(exc, (UnsupportedError, EngineError)):
            return exc
        if isinstance(exc, ValueError):  # llama-cpp-python reports a prompt over the context this way
            return UnsupportedError(str(exc), "messages" if prefix == "chatcmpl" else "prompt")
        return EngineError(f"llama.cpp generation failed: {exc}")

    return translate
