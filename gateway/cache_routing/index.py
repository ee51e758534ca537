"""One replica's approximate prefix index: which prompt blocks its engine holds, as far as the gateway knows.

Updated when a request is placed (its prompt will be computed there) and corrected by what the
engine reports back: the tokens it reused. Bounded: at most `capacity` blocks, the least recently
used evicted first, which is how the engines evict too (llama-server's prompt cache, vLLM's and
SGLang's block pools are LRU). The capacity learns the engine's real size: a block the index held
but the engine did not (a miss the index did not predict) means the engine holds less than the
index, which shrinks to what it holds minus a margin; a hit beyond what it predicted means the
engine holds more, and the capacity grows. So an index with too large a guess forgets what the
engine has forgotten after its first misses, without knowing the engine's cache size.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

SHRINK = 0.8
"""After a miss it did not predict, the index keeps this share of what it held."""
SLACK_BLOCKS = 2
"""Reuse this close to the prediction confirms it: the last block of a prompt, a chat template's
turn tokens or a tokenizer's boundary can differ from the characters' blocks."""


@dataclass(frozen=True, slots=True)
class Correction:
    predicted: int
    reused: int
    verdict: str
    """right (the engine reused what the index predicted), over (it reused less: the index had
    predicted what the engine forgot, and shrank), or under (it reused more: the index grew)."""


class PrefixIndex:
    def __init__(self, capacity: int, floor: int = 16) -> None:
        self.limit = max(capacity, floor)
        """The most blocks it may ever hold (its memory bound)."""
        self.floor = min(floor, self.limit)
        self.capacity = self.limit
        """What it believes the engine holds at most, learned from the engine's reports."""
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, blocks: Sequence[int]) -> int:
        """Leading blocks of the chain held here (a chained hash present means its whole prefix was)."""
        n = 0
        for block in blocks:
            if block not in self._blocks:
                break
            n += 1
        return n

    def overflow(self, blocks: Sequence[int], held: int) -> int:
        """Blocks the index would evict to take this chain (of which it holds `held` leading ones)."""
        return max(0, len(self._blocks) + len(blocks) - held - self.capacity)

    def insert(self, blocks: Sequence[int]) -> None:
        """The engine computes (or reuses) these blocks now: they are the most recently used, the first
        most of all, so eviction takes a prompt's tail before its head (as the engines do: a shared
        system prompt outlives each conversation built on it)."""
        for block in reversed(blocks):
            self._blocks[block] = None
            self._blocks.move_to_end(block)
        self._evict()

    def correct(self, blocks: Sequence[int], predicted: int, reused: int) -> Correction:
        """The engine reused `reused` leading blocks of a prompt the index predicted `predicted` of;
        after the request the engine holds the whole prompt."""
        if reused + SLACK_BLOCKS < predicted:
            for block in blocks[reused:predicted]:  # forgotten by the engine before this request
                self._blocks.pop(block, None)
            self.capacity = max(self.floor, int(len(self._blocks) * SHRINK))
            verdict = "over"
        elif reused > predicted + SLACK_BLOCKS:
            self.capacity = min(self.limit, self.capacity + (reused - predicted))
            verdict = "under"
        else:
            verdict = "right"
            if predicted and len(self._blocks) >= self.capacity:
                self.capacity = min(self.limit, self.capacity + len(blocks) - predicted)
        self.insert(blocks)
        return Correction(predicted, reused, verdict)

    def clear(self) -> None:
        """The engine lost its cache (it restarted): it holds nothing, and may hold as much as ever."""
        self._blocks.clear()
        self.capacity = self.limit

    def _evict(self) -> None:
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)
