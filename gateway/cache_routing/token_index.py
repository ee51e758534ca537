"""What one engine holds in its KV cache, as token blocks: a mirror kept from the engine's own events.

vLLM names each cached block by its own chained hash (seeded per process, so not computable here)
and publishes, per event, the block hashes, the parent block's hash and the blocks' token ids.
This index hashes the same token blocks its own way (block i's hash covers blocks 0..i, like the
engine's), keeps engine hash -> ours so that a removal, or a later event naming a parent, finds
its block, and answers how many leading tokens of a tokenized prompt the engine holds.

Only plain blocks count: a block the engine hashed with extra keys (a LoRA, a cache salt, an
image) holds different KV for the same tokens, so it is never matched by token ids alone; neither
is a block whose parent this index does not know (it cannot be placed in a chain). A block the
engine stores twice (two requests computed it at once) is removed once per copy. Memory is
bounded: past `max_blocks`, the oldest stored block is forgotten (the index then under-reports,
never over-reports). Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence

EngineHash = bytes | int
"""vLLM's ExternalBlockHash: sha256 bytes, or an int with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES."""

MAX_BLOCKS = 262_144
"""About 60 MB of index at most; an engine's KV pool rarely has more blocks (an 80 GB GPU holds
~30k blocks of 16 tokens of an 8B llama)."""


def block_hash(parent: bytes, tokens: Sequence[int]) -> bytes:
    return hashlib.blake2b(parent + array("q", tokens).tobytes(), digest_size=16).digest()


class TokenBlockIndex:
    def __init__(self, max_blocks: int = MAX_BLOCKS) -> None:
        self.max_blocks = max_blocks
        self.block_size: int | None = None
        """Tokens per block, learned from the first block stored (the engine's --block-size)."""
        self._ours: dict[EngineHash, bytes] = {}
        self._held: OrderedDict[bytes, EngineHash] = OrderedDict()
        self._copies: dict[EngineHash, int] = {}
        self.skipped = 0
        """Blocks not indexed: an unknown parent, extra keys, another block size, a malformed event."""
        self.events_stored = 0
        self.events_removed = 0
        """Blocks the engine said it stored and evicted (indexed or not)."""

    def __len__(self) -> int:
        return len(self._held)

    def stored(self, hashes: Sequence[EngineHash], parent: EngineHash | None, token_ids: Sequence[int],
               block_size: int, plain: bool = True) -> int:
        """The engine cached `hashes`, consecutive blocks of `token_ids` following `parent` (None: the
        first blocks of a prompt). Returns how many were indexed."""
        self.events_stored += len(hashes)
        if self.block_size is None and plain and block_size > 0:
            self.block_size = block_size
        if (not plain or block_size != self.block_size or len(token_ids) != len(hashes) * block_size
                or parent is not None and parent not in self._ours):
            self.skipped += len(hashes)
            return 0
        previous = b"" if parent is None else self._ours[parent]
        for i, engine_hash in enumerate(hashes):
            ours = block_hash(previous, token_ids[i * block_size:(i + 1) * block_size])
            if self._ours.get(engine_hash, ours) != ours:  # the engine's hash names other tokens: trust neither
                self._forget(engine_hash)
                self.skipped += len(hashes) - i
                return i
            self._ours[engine_hash] = ours
            self._held[ours] = engine_hash
            self._held.move_to_end(ours)
            self._copies[engine_hash] = self._copies.get(engine_hash, 0) + 1
            previous = ours
        while len(self._held) > self.max_blocks:
            _, oldest = self._held.popitem(last=False)
            self._ours.pop(oldest, None)
            self._copies.pop(oldest, None)
        return len(hashes)

    def removed(self, hashes: Sequence[EngineHash]) -> None:
        """The engine evicted one copy of each of these blocks (unknown ones are ignored)."""
        self.events_removed += len(hashes)
        for engine_hash in hashes:
            copies = self._copies.get(engine_hash)
            if copies is None:
                continue
            if copies > 1:
                self._copies[engine_hash] = copies - 1
            else:
                self._forget(engine_hash)

    def _forget(self, engine_hash: EngineHash) -> None:
        ours = self._ours.pop(engine_hash, None)
        self._copies.pop(engine_hash, None)
        if ours is not None:
            self._held.pop(ours, None)

    def cleared(self) -> None:
        """The engine dropped every block (AllBlocksCleared, a restart)."""
        self._ours.clear()
        self._held.clear()
        self._copies.clear()

    def matched_tokens(self, tokens: Sequence[int]) -> int:
        """Leading tokens of this prompt the engine would reuse: whole blocks only, all held, and at
        most one token short of the prompt (vLLM computes at least the last token, so a prompt of
        exactly k held blocks reuses k-1 of them)."""
        size = self.block_size
        if size is None or not self._held:
            return 0
        reusable = (len(tokens) - 1) // size if tokens else 0
        previous = b""
        n = 0
        while n < reusable:
            ours = block_hash(previous, tokens[n * size:(n + 1) * size])
            if ours not in self._held:
                break
            previous = ours
            n += 1
        return n * size
