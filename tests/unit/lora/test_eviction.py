"""Which adapter to load, evict or wait for with runtime loading (adapters/lora_eviction.py): a table."""

from __future__ import annotations

import pytest

from adapters.lora_eviction import Decision, Held, decide

IDLE_OLD, IDLE_NEW, BUSY_OLD = Held(1, 0), Held(5, 0), Held(0, 2)


@pytest.mark.parametrize(("wanted", "held", "loading", "capacity", "want"), [
    ("a", {"a": IDLE_OLD}, set(), 2, Decision("use")),
    ("a", {"a": BUSY_OLD}, set(), 1, Decision("use")),  # in flight already: shared, not reloaded
    ("a", {}, {"a"}, 2, Decision("join")),  # a second first request waits for the same load
    ("a", {}, set(), 2, Decision("load")),
    ("c", {"a": IDLE_OLD}, set(), 2, Decision("load")),  # a free place
    ("c", {"a": IDLE_OLD, "b": IDLE_NEW}, set(), 2, Decision("load", evict="a")),  # least recently used
    ("c", {"a": BUSY_OLD, "b": IDLE_NEW}, set(), 2, Decision("load", evict="b")),  # in flight is never evicted
    ("c", {"a": BUSY_OLD, "b": Held(3, 1)}, set(), 2, Decision("wait")),  # every place in use
    ("c", {"a": IDLE_OLD}, {"b"}, 2, Decision("load", evict="a")),  # a load under way takes a place
    ("c", {}, {"a", "b"}, 2, Decision("wait")),
    ("b", {"a": IDLE_OLD}, set(), 0, Decision("load", evict="a")),  # capacity below 1 counts as 1
])
def test_decide(wanted: str, held: dict[str, Held], loading: set[str], capacity: int, want: Decision) -> None:
    assert decide(wanted, held, frozenset(loading), capacity) == want
