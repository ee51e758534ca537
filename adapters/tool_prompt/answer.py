"""The model's answer in the form (render.py) back into text or tool calls, whole or as it streams.

A reply (`{"response": "..."}`) streams as its string is decoded, escape by escape; a call is held until
the answer ends (its name and arguments are then known). An answer not in the form (a model that ignored
it where no grammar held it) is text, as written. A call cut by the token limit keeps its name and the
arguments as far as the engine wrote them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import orjson

_REPLY = re.compile(r'\{\s*"response"\s*:\s*"')
_CALL = re.compile(r'\{\s*"tool_calls?"')
_PARTIAL_CALL = re.compile(r'\s*\{\s*"tool_call"\s*:\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"(?:\s*,\s*"arguments"\s*:\s*(.*))?',
                           re.DOTALL)
_KEYS = ('{"response"', '{"tool_call"')


@dataclass
class Parsed:
    text: str = ""
    calls: list[tuple[str, str]] = field(default_factory=list)
    """(name, arguments as JSON text)."""


def _could_become(prefix: str) -> bool:
    """`prefix` (whitespace dropped) may still grow into a reply's or a call's opening."""
    squeezed = re.sub(r"\s+", "", prefix)
    return any(key.startswith(squeezed) or squeezed.startswith(key) for key in _KEYS)


def _string_end(raw: str, start: int) -> tuple[int, bool]:
    """How far `raw[start:]` can be decoded now (never inside an escape), and whether the string closed there."""
    j = start
    while j < len(raw):
        c = raw[j]
        if c == '"':
            return j, True
        if c == "\\":
            if j + 1 >= len(raw):
                break
            if raw[j + 1] == "u":
                width = 6
                if j + 6 <= len(raw) and 0xD800 <= int(raw[j + 2:j + 6], 16) <= 0xDBFF:
                    width = 12  # a surrogate pair: both halves or none
                if j + width > len(raw):
                    break
                j += width
            else:
                j += 2
            continue
        j += 1
    return j, False


def _decode(segment: str) -> str:
    try:
        return str(json.loads('"' + segment + '"', strict=False))
    except ValueError:
        return segment


class AnswerStream:
    """Feed the answer's text as it comes; `feed` returns the reply text to send now, `finish` the rest."""

    def __init__(self) -> None:
        self.raw = ""
        self.mode = "undecided"  # -> "reply" (decoding), "closed" (reply done), "text" (not the form), "held"
        self.at = 0  # reply: where the undecoded part of the string starts
        self.sent = ""

    def feed(self, piece: str) -> str:
        self.raw += piece
        if self.mode == "undecided":
            self._decide()
        if self.mode == "text":
            out, self.at = self.raw[self.at:], len(self.raw)
            return self._sent(out)
        if self.mode == "reply":
            return self._sent(self._reply())
        return ""

    def _decide(self) -> None:
        head = self.raw.lstrip()
        if not head:
            return
        if not head.startswith("{"):
            self.mode = "text"
            return
        reply = _REPLY.match(head)
        if reply is not None:
            self.mode, self.at = "reply", len(self.raw) - len(head) + reply.end()
        elif _CALL.match(head) or not _could_become(head):
            self.mode = "held"

    def _reply(self) -> str:
        end, closed = _string_end(self.raw, self.at)
        out = _decode(self.raw[self.at:end])
        self.at = end
        if closed:
            self.mode = "closed"
        return out

    def _sent(self, text: str) -> str:
        self.sent += text
        return text

    def finish(self) -> tuple[str, Parsed]:
        """The text not sent yet, and the whole answer."""
        if self.mode == "undecided":
            self.mode = "text"
        if self.mode in ("text", "reply", "closed"):
            tail = self.feed("") if self.mode != "closed" else ""
            if self.mode == "reply":  # cut inside an escape: what is left, as written
                tail += self._sent(self.raw[self.at:])
            return tail, Parsed(text=self.sent)
        parsed = _held(self.raw)
        return self._sent(parsed.text), parsed


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value if value is not None else {}).decode()


def _call(value: Any) -> tuple[str, str] | None:
    if isinstance(value, dict) and isinstance(value.get("name"), str):
        return value["name"], _arguments(value.get("arguments"))
    return None


def _held(raw: str) -> Parsed:
    try:
        value = orjson.loads(raw.strip())
    except orjson.JSONDecodeError:
        partial = _PARTIAL_CALL.match(raw)
        if partial is not None:  # cut by the token limit: the arguments as the engine wrote them
            return Parsed(calls=[(_decode(partial.group(1)), partial.group(2) or "")])
        return Parsed(text=raw)
    if isinstance(value, dict):
        calls = [c for c in map(_call, [value.get("tool_call")] if "tool_call" in value else value.get("tool_calls") or [])
                 if c is not None]
        if calls:
            return Parsed(calls=calls)
        if isinstance(value.get("response"), str):
            return Parsed(text=value["response"])
    return Parsed(text=raw)


def parse_answer(text: str) -> Parsed:
    """A whole answer -> its reply text, or its calls."""
    stream = AnswerStream()
    stream.feed(text)
    return stream.finish()[1]
