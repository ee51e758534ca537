"""Content an engine cannot take (images, audio) is refused with a 400 before it is sent.

An engine that receives an image it cannot read answers an error of its own (llama-server: a 500
"image input is not supported"); sent to a replica, that error used to count against the
replica's health, so a few such requests took a model offline. Asking the engine's declared
capabilities first answers the client, and never the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from adapters.base import Capabilities
from gateway.api.errors import APIError
from gateway.request_view import AUDIO_PARTS, IMAGE_PARTS

if TYPE_CHECKING:
    from gateway.routing import Backend



def refused_kind(part_type: str, caps: Capabilities) -> str | None:
    """"image" or "audio" when a content part of this type needs an input the engine cannot take."""
    if part_type in IMAGE_PARTS and not caps.image_input:
        return "image"
    if part_type in AUDIO_PARTS and not caps.audio_input:
        return "audio"
    return None


def check_modalities(backend: Backend, messages: Iterable[dict[str, Any]], param: Callable[[int], str]) -> None:
    """400 (code `unsupported_content`) for the first content part the engine cannot take; `param(i)`
    names message i's content in the client's own API."""
    caps, model, engine = backend.adapter.capabilities, backend.model_id, backend.engine
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for part in content:
            kind = refused_kind(str(part.get("type")), caps) if isinstance(part, dict) else None
            if kind is not None:
                raise APIError(400, f"model `{model}` (engine {engine}) does not accept {kind} input: "
                                    f"{param(i)} holds a content part of type {part.get('type')}; send text",
                               param=param(i), code="unsupported_content")
