"""Table tests of the cache-aware router's pure parts: blocks, the prefix index, slots and the cost."""

from __future__ import annotations

import pytest

from gateway.cache_routing.blocks import MAX_CHARS, chain, prompt_text, shared
from gateway.cache_routing.cost import EVICTION_WEIGHT, Place, cheapest, estimate
from gateway.cache_routing.index import PrefixIndex
from gateway.cache_routing.slots import SlotMap
from gateway.cache_routing.tracker import ReplicaCache
from gateway.request_view import view_of
from gateway.routing.balancer import Balancer, Candidate

SYSTEM = {"role": "system", "content": "You are terse. " * 40}


def conversation(doc: str, *turns: str) -> dict[str, object]:
    messages: list[dict[str, str]] = [SYSTEM, {"role": "user", "content": doc}]
    for turn in turns:
        messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": turn}]
    return {"messages": messages}


def blocks_of(body: dict[str, object]) -> tuple[int, ...]:
    text = prompt_text(view_of(body))
    assert text is not None
    return chain(text, 64)


def test_chained_blocks_share_exactly_the_common_prefix() -> None:
    a, b = blocks_of(conversation("doc A " * 50)), blocks_of(conversation("doc B " * 50))
    system_blocks = len(prompt_text(view_of({"messages": [SYSTEM]})) or "") // 64
    assert shared(a, b) == system_blocks  # the shared system prompt, not the whole of either
    later = blocks_of(conversation("doc A " * 50, "and then?"))
    assert shared(a, later) == len(a)  # a later turn extends its conversation's chain
    assert chain("x" * 63) == ()  # only whole blocks
    assert len(chain("x" * (2 * MAX_CHARS), 64)) == MAX_CHARS // 64  # an oversized prompt: its first MiB
    assert prompt_text(view_of({"prompt": "hi"})) == "hi" and prompt_text(view_of({"prompt": [[1, 2]]})) == "[1,2]"
    assert prompt_text(view_of({})) is None


@pytest.mark.parametrize(
    ("held", "asked", "matched"),
    [
        ([1, 2, 3], [1, 2, 3, 4], 3),
        ([1, 2, 3], [9, 2, 3], 0),  # chained: a different first block means nothing is shared
        ([], [1], 0),
    ],
)
def test_index_matches_leading_blocks(held: list[int], asked: list[int], matched: int) -> None:
    index = PrefixIndex(1000)
    index.insert(held)
    assert index.match(asked) == matched


def test_index_evicts_least_recently_used_tail_first() -> None:
    index = PrefixIndex(20, floor=4)
    index.insert(list(range(100, 110)))  # conversation A: 10 blocks
    index.insert(list(range(200, 212)))  # conversation B: 12 blocks, so 2 of A's must go
    assert len(index) == 20
    assert index.match(list(range(200, 212))) == 12
    assert index.match(list(range(100, 110))) == 8  # A lost its tail, not its head


@pytest.mark.parametrize(
    ("predicted", "reused", "verdict", "capacity_after"),
    [
        (10, 10, "right", 1000),
        (10, 9, "right", 1000),  # within the slack of a block or two: a template's turn tokens
        (10, 0, "over", 16),  # the engine had forgotten it: the index shrinks to what it holds
        (0, 10, "under", 1000),
    ],
)
def test_index_learns_from_the_engines_report(predicted: int, reused: int, verdict: str, capacity_after: int) -> None:
    index = PrefixIndex(1000, floor=16)
    prompt = list(range(12))
    index.insert(prompt[:predicted])
    index.insert(list(range(500, 520)))  # another conversation
    correction = index.correct(prompt, predicted, reused)
    assert correction.verdict == verdict
    assert index.capacity == max(capacity_after, 16) if verdict == "over" else index.capacity == capacity_after
    assert index.match(prompt) == len(prompt)  # after the request the engine holds the whole prompt


def test_a_miss_shrinks_the_capacity_to_what_the_engine_holds() -> None:
    index = PrefixIndex(1000, floor=4)
    for start in range(0, 400, 40):
        index.insert(list(range(start, start + 40)))  # 400 blocks believed held
    index.correct(list(range(0, 40)), predicted=40, reused=0)
    assert index.capacity == int(360 * 0.8)
    assert len(index) <= index.capacity
    index.clear()  # the engine restarted
    assert len(index) == 0 and index.capacity == 1000
    assert index.match(list(range(0, 40))) == 0


def test_overflow_counts_what_a_new_prompt_would_evict() -> None:
    index = PrefixIndex(20, floor=4)
    index.insert(list(range(15)))
    assert index.overflow(list(range(15)) + [99, 98], held=15) == 0
    assert index.overflow(list(range(100, 110)), held=0) == 5


def test_slots_send_a_session_back_to_its_slot_and_new_ones_to_the_least_recently_used() -> None:
    slots = SlotMap(2, block_chars=8)
    a, b, c = "user: hi", "user: a colour", "user: the fruit"
    assert slots.pick(a) == (0, 0)
    slots.take(0, a)
    assert slots.pick(b) == (1, 0)  # slot 0 busy
    slots.take(1, b)
    assert slots.pick(c) is None  # both busy: the engine would make it wait
    slots.give(0)
    slots.give(1)
    # A's next turn, however long: it continues all of slot 0's prompt
    assert slots.pick(a + " / assistant: hello / user: " + "long " * 100) == (0, len(a))
    assert slots.pick(c) == (0, 0)  # new (it shares only "user: " with the others, under a block): least recently used
    assert slots.pick("user: a colour, and then?") == (1, len(b))
    slots.clear()
    assert slots.pick(a) == (0, 0)


def place(matched: float = 0, outstanding: int = 0, slots: int = 2, prompt: float = 1000, rate: float = 100,
          service: float = 4.0, engine_load: float = 0, evicted: float = 0) -> Place:
    return Place(outstanding, engine_load, slots, matched, prompt, rate, service, evicted)


@pytest.mark.parametrize(
    ("places", "chosen", "reason"),
    [
        ([place(), place()], 0, "cache_cold"),  # nothing cached anywhere: the first in the rotated order
        ([place(outstanding=1), place()], 1, "cache_cold"),  # ...the less loaded
        ([place(), place(matched=900)], 1, "cache_hit"),
        # the cached replica is full (2 running, 1 waiting): 2 ahead x 4 s / 2 slots = 4 s + 1 s prefill,
        # against 10 s of prefill elsewhere: it still pays to wait
        ([place(matched=900, outstanding=3), place()], 0, "cache_hit"),
        # 8 ahead: 16 s of waiting costs more than recomputing
        ([place(matched=900, outstanding=9), place()], 1, "cache_load"),
        # the engine's own queue counts too (a shared upstream's other clients)
        ([place(matched=900, engine_load=9), place()], 1, "cache_load"),
        # equal caches: what the new part evicts from a full cache decides
        ([place(matched=100, evicted=800), place(matched=100)], 1, "cache_hit"),
    ],
)
def test_cost_weighs_the_wait_against_recomputing(places: list[Place], chosen: int, reason: str) -> None:
    assert cheapest(places, range(len(places))) == (chosen, reason)


def test_estimate_is_in_seconds() -> None:
    e = estimate(place(matched=200, outstanding=3, prompt=1000, rate=100, service=4.0, evicted=100))
    assert (e.wait_seconds, e.prefill_seconds, e.eviction_seconds) == (4.0, 8.0, EVICTION_WEIGHT * 1.0)
    assert estimate(Place(5, 0, None, 0, 1000, 100, 4.0)).wait_seconds == 0.0  # uncapped: the engine batches it


def test_balancer_by_cost_keeps_the_bound_and_health() -> None:
    balancer = Balancer(affinity="cache", load_factor=1.25)
    hot = [Candidate("0", outstanding=6), Candidate("1", outstanding=1)]
    # replica 0 holds the prompt but is over ceil(1.25 * 8 / 2) = 5: the bound spills it
    choice = balancer.choose(hot, places=[place(matched=1000, outstanding=6), place(outstanding=1)])
    assert choice is not None and (choice.index, choice.reason) == (1, "cache_load")
    down = [Candidate("0", available=False), Candidate("1")]
    choice = balancer.choose(down, places=[place(matched=1000), place()])
    assert choice is not None and choice.index == 1
    no_prompt = balancer.choose([Candidate("0", outstanding=2), Candidate("1")])
    assert no_prompt is not None and (no_prompt.index, no_prompt.reason) == (1, "least_outstanding")


@pytest.mark.parametrize(
    ("engines", "ours", "expected"),
    [
        # two gateways in front of the same two replicas, each with its own part of the load; the engines
        # count all of it. Before, each bounded on its own part: A (2, 0) spilled the conversation from
        # replica 0 (its bound 2) while B (1, 2) kept it there (its bound 3)
        ((3, 2), {"A": (2, 0), "B": (1, 2)}, (0, "cache_hit")),
        # the engines' 6 + 1: replica 0 is over ceil(1.25 * 8 / 2) = 5 for both (before, B kept it: 2 < 3)
        ((6, 1), {"A": (4, 0), "B": (2, 1)}, (1, "cache_load")),
    ],
)
def test_gateways_in_front_of_the_same_replicas_bound_them_alike(
        engines: tuple[int, int], ours: dict[str, tuple[int, int]], expected: tuple[int, str]) -> None:
    for gateway, own in ours.items():
        candidates = [Candidate(str(i), outstanding=own[i], engine_load=engines[i]) for i in range(2)]
        places = [place(matched=1000 if i == 0 else 0, outstanding=own[i], engine_load=engines[i], service=0.1)
                  for i in range(2)]
        choice = Balancer(affinity="cache", load_factor=1.25).choose(candidates, places=places)
        assert choice is not None and (choice.index, choice.reason) == expected, gateway


class FollowingView:
    """A precise view that, like KvEventsCache, already follows the engine's new launch on its own."""

    answering = True
    resets = 0

    def reset(self) -> None:
        self.resets += 1
        self.answering = False  # it would be blind until it subscribed again

    def matched(self, tokens: object) -> int:
        return 0


def test_a_restart_empties_the_index_and_leaves_the_precise_view_answering() -> None:
    view = FollowingView()
    cache = ReplicaCache(64, 64, precise=view)  # type: ignore[arg-type]
    cache.follow((100, 0))
    cache.chosen(cache.place(blocks_of(conversation("doc A " * 50)), "x" * 640, 0, 0.0, 2)[1])
    assert len(cache.index) > 0
    cache.follow((200, 1))  # a new engine process: it holds nothing of what the old one did
    assert len(cache.index) == 0
    assert view.answering and view.resets == 0  # the view's own (empty) record of the new launch stands
    place, placement = cache.place(blocks_of(conversation("doc A " * 50)), "x" * 640, 0, 0.0, 2, 0, 160)
    assert placement.precise_tokens == 0 and place.matched_tokens == 0


@pytest.mark.parametrize(("options", "pays"), [
    ({"cache_ram_mib": 0}, True),  # the slots are all the engine holds: the router's choice is what it reuses
    ({"cache_ram_mib": 2048}, False),  # id_slot would bypass the host-RAM prompt cache
    ({}, False),  # unset: llama-server's own 8 GiB cache
])
def test_llama_server_slots_are_chosen_only_without_its_prompt_cache(options: dict[str, object], pays: bool) -> None:
    from adapters.llama_server import SPEC

    assert SPEC.slot_field == "id_slot" and SPEC.slots_pay is not None and SPEC.slots_pay(options) is pays
