"""The one per-request view of a prompt that tenancy, scheduling and routing read (gateway/request_view/view.py)."""

from gateway.request_view.estimate import text_tokens
from gateway.request_view.view import AUDIO_PARTS, IMAGE_PARTS, RequestView, Turn, content_text, view_of

__all__ = ["AUDIO_PARTS", "IMAGE_PARTS", "RequestView", "Turn", "content_text", "text_tokens", "view_of"]
