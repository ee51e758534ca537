"""Stop sequences for engines that do not apply them: cut the text, never emit part of a stop."""

from __future__ import annotations

from typing import Any


def stop_list(stop: Any) -> tuple[str, ...]:
    """The request's `stop` field (a string, a list of strings or null) as a tuple of non-empty strings."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,) if stop else ()
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return tuple(s for s in stop if s)
    raise ValueError("stop must be a string or a list of strings")


class StopMatcher:
    """Feed text segments as they are generated; get back the text that is safe to send.

    Text that could still turn into a stop sequence is held back until the next segment
    decides it. Once a stop sequence is seen, `stopped` is True and the text before it has
    been returned; later input is ignored.
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.stopped = False
        self._held = ""

    def feed(self, segment: str) -> str:
        if self.stopped:
            return ""
        if not self.stops:
            return segment
        text = self._held + segment
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self._held = ""
            return text[:cut]
        keep = self._partial_suffix(text)
        self._held = text[len(text) - keep:] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """The held-back text, at the end of generation (no stop sequence completed)."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _partial_suffix(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop sequence."""
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:n]):
                    best = n
                    break
        return best
