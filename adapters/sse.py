"""Incremental SSE decoding, tolerant of every engine's framing."""

from __future__ import annotations


class SSEParser:
    """Incremental SSE decoder: feed raw bytes, get each complete event's data payload.

    Handles `\\n`, `\\r\\n` and `\\r` line ends (also split across reads), comment and ping
    lines, fields other than `data`, multi-line data and whitespace after the payload.
    """

    __slots__ = ("_buf", "_data", "_cr")

    def __init__(self) -> None:
        self._buf = b""
        self._data: bytes | None = None
        self._cr = False

    def feed(self, chunk: bytes) -> list[bytes]:
        if self._cr and chunk[:1] == b"\n":
            chunk = chunk[1:]
        if b"\r" in chunk:
            self._cr = chunk[-1:] == b"\r"
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        else:
            self._cr = False
        lines = (self._buf + chunk if self._buf else chunk).split(b"\n")
        self._buf = lines.pop()
        out: list[bytes] = []
        for line in lines:
            if not line:
                if self._data is not None:
                    out.append(self._data)
                    self._data = None
            elif line[:5] == b"data:":
                value = line[5:].strip()
                self._data = value if self._data is None else self._data + b"\n" + value
        return out

    def close(self) -> list[bytes]:
        """End of body: an event not followed by a blank line still counts."""
        out = self.feed(b"\n\n") if (self._buf or self._data is not None) else []
        return out
