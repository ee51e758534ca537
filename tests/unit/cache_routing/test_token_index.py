"""The token-block mirror of an engine's KV cache: events in, leading held tokens out (no engine)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gateway.cache_routing.token_index import TokenBlockIndex

B = 4
PROMPT = list(range(100, 118))  # 18 tokens: 4 whole blocks and 2 tokens
OTHER = PROMPT[:8] + [7, 7, 7, 7] + PROMPT[12:]  # shares the first 2 blocks only


def store_prompt(index: TokenBlockIndex, tokens: list[int], tag: str = "e", blocks: int | None = None) -> list[str]:
    """Store `tokens`' whole blocks as the engine does after a prefill: one event, hashes named tag0, tag1..."""
    n = len(tokens) // B if blocks is None else blocks
    hashes = [f"{tag}{i}" for i in range(n)]
    index.stored([h.encode() for h in hashes], None, tokens[:n * B], B)
    return hashes


Step = Callable[[TokenBlockIndex], object]


def stored_in_two_events(index: TokenBlockIndex) -> None:
    index.stored([b"e0", b"e1"], None, PROMPT[:8], B)
    index.stored([b"e2", b"e3"], b"e1", PROMPT[8:16], B)  # the parent chains the second event to the first


@pytest.mark.parametrize("steps, query, matched", [
    ([], PROMPT, 0),
    ([lambda i: store_prompt(i, PROMPT)], PROMPT, 16),
    ([lambda i: store_prompt(i, PROMPT)], PROMPT[:16], 12),  # k whole held blocks: the engine recomputes the last
    ([lambda i: store_prompt(i, PROMPT)], PROMPT[:17], 16),
    ([lambda i: store_prompt(i, PROMPT)], PROMPT[:3], 0),  # shorter than a block
    ([lambda i: store_prompt(i, PROMPT)], OTHER, 8),  # only the shared leading blocks
    ([lambda i: store_prompt(i, PROMPT)], [1] + PROMPT, 0),  # a shifted prompt shares no block
    ([stored_in_two_events], PROMPT, 16),
    ([lambda i: store_prompt(i, PROMPT), lambda i: i.removed([b"e2"])], PROMPT, 8),  # a hole ends the run
    ([lambda i: store_prompt(i, PROMPT), lambda i: i.removed([b"e0"])], PROMPT, 0),
    ([lambda i: store_prompt(i, PROMPT), lambda i: i.removed([b"zz"])], PROMPT, 16),  # unknown: ignored
    ([lambda i: store_prompt(i, PROMPT), lambda i: i.cleared()], PROMPT, 0),
    # two copies of one block (two requests computed it at once): gone only when both are evicted
    ([lambda i: store_prompt(i, PROMPT), lambda i: store_prompt(i, PROMPT), lambda i: i.removed([b"e3"])], PROMPT, 16),
    ([lambda i: store_prompt(i, PROMPT), lambda i: store_prompt(i, PROMPT),
      lambda i: i.removed([b"e3"]), lambda i: i.removed([b"e3"])], PROMPT, 12),
    # an event whose parent is unknown (missed, or forgotten) cannot be placed in a chain
    ([lambda i: i.stored([b"e2", b"e3"], b"e1", PROMPT[8:16], B)], PROMPT, 0),
    # a LoRA's or a salted prompt's blocks hold other KV for the same tokens
    ([lambda i: i.stored([b"e0", b"e1"], None, PROMPT[:8], B, plain=False)], PROMPT, 0),
    # another block size than the index learned, or token ids that do not fill the hashes: skipped
    ([lambda i: store_prompt(i, PROMPT, blocks=1), lambda i: i.stored([b"x0"], None, PROMPT[:8], 8)], PROMPT, 4),
    ([lambda i: i.stored([b"e0", b"e1"], None, PROMPT[:7], B)], PROMPT, 0),
], ids=["empty", "held", "exact-blocks", "one-over", "short", "shared-prefix", "shifted", "chained-events",
        "hole", "first-removed", "unknown-removal", "cleared", "copy-left", "both-copies-gone", "orphan", "lora",
        "other-block-size", "ragged"])
def test_matched_tokens(steps: list[Step], query: list[int], matched: int) -> None:
    index = TokenBlockIndex()
    for step in steps:
        step(index)
    assert index.matched_tokens(query) == matched


def test_memory_is_bounded_by_forgetting_the_oldest_blocks() -> None:
    index = TokenBlockIndex(max_blocks=6)
    store_prompt(index, PROMPT, "a")  # 4 blocks
    disjoint = [t + 1000 for t in PROMPT]
    store_prompt(index, disjoint, "b")  # 4 more: the first 2 of `a` go
    assert len(index) == 6
    assert index.matched_tokens(PROMPT + [0]) == 0  # its first block is forgotten: under-reports, never over
    assert index.matched_tokens(disjoint + [0]) == 16
    index.removed([b"a0"])  # a forgotten block's removal is harmless
    assert len(index) == 6


def test_a_hash_that_names_other_tokens_is_dropped() -> None:
    index = TokenBlockIndex()
    store_prompt(index, PROMPT)
    assert index.stored([b"e0"], None, OTHER[:4][::-1], B) == 0
    assert index.matched_tokens(PROMPT) == 0
