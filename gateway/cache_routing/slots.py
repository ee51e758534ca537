"""Which of a llama-server replica's parallel slots a request goes to (`id_slot`).

Each slot holds the KV of the last prompt it ran. A request goes to the free slot whose last
prompt shares the most with it (at least a block's worth of characters, or all of that prompt:
the conversation it continues), else to the free slot used least recently (whose KV is least
likely to be asked for again), so a session returning after its think time finds
its conversation where it left it instead of a slot another session overwrote. Only free slots
are chosen: the gateway admits no more requests to a replica than it has slots, so a free slot
always exists when a request is dispatched; a slot the engine is busy with would make it wait.
"""

from __future__ import annotations

import os

from gateway.cache_routing.blocks import BLOCK_CHARS


class SlotMap:
    def __init__(self, slots: int, block_chars: int = BLOCK_CHARS) -> None:
        self.slots = slots
        self.block_chars = block_chars
        self._held: list[str] = ["" for _ in range(slots)]
        self._used: list[int] = [0] * slots
        self._busy: set[int] = set()
        self._tick = 0

    def holds(self, slot: int, text: str) -> int:
        """Leading characters of `text` the slot holds, where that counts as holding its prefix."""
        held = self._held[slot]
        common = len(os.path.commonprefix((held, text)))
        return common if common >= self.block_chars or (held and common == len(held)) else 0

    def pick(self, text: str) -> tuple[int, int] | None:
        """(slot, leading characters of the prompt it holds) for a request; None when every slot is busy."""
        free = [s for s in range(self.slots) if s not in self._busy]
        if not free:
            return None
        best = max(free, key=lambda s: (self.holds(s, text), -self._used[s]))
        held = self.holds(best, text)
        if held == 0:
            best = min(free, key=lambda s: self._used[s])
        return best, held

    @property
    def busy(self) -> int:
        """Slots taken by requests that have not ended."""
        return len(self._busy)

    def take(self, slot: int, text: str) -> None:
        self._tick += 1
        self._busy.add(slot)
        self._held[slot] = text
        self._used[slot] = self._tick

    def give(self, slot: int) -> None:
        self._busy.discard(slot)

    def clear(self) -> None:
        """The engine restarted: its slots hold nothing (requests still marked busy end with errors)."""
        self._held = ["" for _ in range(self.slots)]
