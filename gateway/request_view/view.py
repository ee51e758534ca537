"""One request's prompt as the gateway reads it: built once, at the API edge, from the body the engine
will receive (after any translation), and read by tenancy (the admission charge), scheduling (the
prefill estimate) and routing (the prefix key, the cache blocks), so all four count one prompt one way.

Nothing here reads an image's or an audio clip's bytes: a media part is a fixed number of tokens, not
the length of its data URL. Pure: no I/O, no clock."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.request_view.estimate import text_tokens

IMAGE_PARTS = frozenset({"image_url", "image", "input_image"})
AUDIO_PARTS = frozenset({"input_audio", "audio"})
IMAGE_TOKENS = 768
"""An image's tokens, whatever its size: OpenAI charges a high-detail 1024x1024 image 765, LLaVA-1.5 576, Gemma 3 256."""
AUDIO_TOKENS = 750
"""An audio clip's: Qwen2-Audio's encoder gives 750 for its 30-second window."""
PER_MESSAGE = 6
"""Tokens a chat template adds around each message: SmolLM2's `<|im_start|>role\\n ... <|im_end|>\\n` is 5."""
GENERATION_PROMPT = 3
"""The assistant turn the template opens for the answer (`<|im_start|>assistant\\n`)."""
DEFAULT_SYSTEM = 24
"""The system prompt a template inserts when the conversation has none: SmolLM2's is 19 tokens with its markers,
Qwen2.5's ("You are Qwen, created by Alibaba Cloud...") 20, Llama 3.1's date header 25."""
TOOLS_PREAMBLE = 64
"""What a template writes around the tool definitions (their JSON itself is counted as text)."""
PROMPT_OVERHEAD = 1
"""A completion or embedding input's beginning-of-sequence token."""
SYSTEM_ROLES = frozenset({"system", "developer"})
OUTPUT_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")
"""The completion's limit, as each API names it (Anthropic's `max_tokens` arrives translated into chat's)."""


@dataclass(frozen=True, slots=True)
class Turn:
    """One message (chat) or input item (Responses), as text."""

    role: str
    text: str
    """Its content's text: a string, the text of its parts (never a media part's data), else its JSON."""
    calls: str = ""
    """Its tool calls' JSON (an assistant's), "" when it has none."""
    images: int = 0
    audio: int = 0
    token_ids: int = 0


Prompt = str | tuple[int, ...]
"""A completion prompt or an embedding input: text, or token ids."""


@dataclass(frozen=True, slots=True)
class RequestView:
    turns: tuple[Turn, ...] = ()
    prompts: tuple[Prompt, ...] = ()
    instructions: str = ""
    """The Responses API's `instructions` (sent natively; translated they are a system turn)."""
    tools: str = ""
    """The tool definitions' JSON, "" when there are none."""
    prompt_tokens: int = 0
    """The estimate of what the engine will count as the prompt: text by script, token ids one each,
    media a fixed count, tools by their JSON, the template's overhead."""
    max_output: int | None = None
    """Per choice, as the request limits it; None when it does not."""
    choices: int = 1
    """Completions the engine generates for it (`n`, `best_of`, times the prompts of a batch; 0 for embeddings)."""
    user: str | None = None
    """The body's `user` (OpenAI's end-user id), a session key for affinity routing."""

    @property
    def images(self) -> int:
        return sum(t.images for t in self.turns)

    @property
    def audio(self) -> int:
        return sum(t.audio for t in self.turns)


def content_text(content: Any) -> str:
    """A content value as text: a string, the text parts of a list (a media part's bytes are not read), else JSON."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return "" if content is None else _json(content)


def _json(value: Any) -> str:
    """A value as sorted JSON, "" for nothing; one orjson cannot write (nested past its 254 levels) as its repr,
    never an error: the view is built for every request, before any validation an engine does."""
    if value is None or value == [] or value == {}:
        return ""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:  # orjson.JSONEncodeError is one
        return repr(value)


def _parts(content: Any) -> tuple[int, int, int]:
    """(images, audio clips, token ids) in a content value."""
    if not isinstance(content, list):
        return 0, 0, 0
    images = audio = ids = 0
    for part in content:
        if isinstance(part, dict):
            kind = part.get("type")
            if isinstance(kind, str):
                images += kind in IMAGE_PARTS
                audio += kind in AUDIO_PARTS
        elif isinstance(part, int) and not isinstance(part, bool):
            ids += 1
    return images, audio, ids


def _turn(message: Mapping[str, Any]) -> Turn:
    content = message.get("content")
    if content is None and message.get("type") in ("function_call", "function_call_output"):  # Responses items
        content = message.get("output") if message.get("type") == "function_call_output" else None
        calls = _json({k: message.get(k) for k in ("name", "arguments") if k in message})
    else:
        calls = _json(message.get("tool_calls"))
    images, audio, ids = _parts(content)
    role = message.get("role", message.get("type"))
    return Turn(str(role), content_text(content), calls, images, audio, ids)


def _prompts(value: Any) -> tuple[Prompt, ...]:
    """A prompt or input: a string, a list of strings, token ids, or a list of token-id lists."""
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not value:
        return ()
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return (tuple(value),)
    out: list[Prompt] = []
    for item in value:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, list):
            out.append(tuple(v for v in item if isinstance(v, int) and not isinstance(v, bool)))
    return tuple(out)


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _estimate(turns: tuple[Turn, ...], prompts: tuple[Prompt, ...], instructions: str, tools: str) -> int:
    tokens = 0
    for t in turns:
        tokens += (PER_MESSAGE + text_tokens(t.text) + text_tokens(t.calls) + t.token_ids
                   + t.images * IMAGE_TOKENS + t.audio * AUDIO_TOKENS)
    if turns:
        tokens += GENERATION_PROMPT + (0 if turns[0].role in SYSTEM_ROLES or instructions else DEFAULT_SYSTEM)
    for p in prompts:
        tokens += PROMPT_OVERHEAD + (text_tokens(p) if isinstance(p, str) else len(p))
    if instructions:
        tokens += PER_MESSAGE + text_tokens(instructions)
    if tools:
        tokens += TOOLS_PREAMBLE + text_tokens(tools)
    return tokens


def view_of(body: Mapping[str, Any], generates: bool = True) -> RequestView:
    """The view of a chat, completions, (native) Responses or, with `generates` False, embeddings body."""
    messages = body.get("messages")
    turns: tuple[Turn, ...] = ()
    prompts: tuple[Prompt, ...] = ()
    if isinstance(messages, list) and messages:
        turns = tuple(_turn(m) for m in messages if isinstance(m, dict))
    elif "prompt" in body:
        prompts = _prompts(body.get("prompt"))
    else:
        value = body.get("input")
        if isinstance(value, list) and any(isinstance(v, dict) for v in value):
            turns = tuple(_turn(v) for v in value if isinstance(v, dict))
        else:
            prompts = _prompts(value)
    instructions = body.get("instructions") if isinstance(body.get("instructions"), str) else ""
    tools = _json(body.get("tools") or body.get("functions"))
    output = next((v for v in (_positive(body.get(f)) for f in OUTPUT_FIELDS) if v is not None), None)
    per_prompt = max(_positive(body.get("n")) or 1, _positive(body.get("best_of")) or 1)
    choices = per_prompt * (len(prompts) if "prompt" in body and prompts else 1) if generates else 0
    user = body.get("user") if isinstance(body.get("user"), str) else None
    return RequestView(turns, prompts, instructions, tools, _estimate(turns, prompts, instructions, tools),
                       output if generates else None, choices, user)
