"""The scheduler's pure decisions as tables: for given arrivals (flow, tier, weight, time), the
order of service, the aging bound, and whom a full queue refuses."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from gateway.scheduling import Demand, FairQueue, Refused

Arrival = tuple[str, str, str]
"""(label, flow, tier); weight 1 unless the flow is in WEIGHTS."""


def served(arrivals: Sequence[Arrival], weights: dict[str, float] | None = None, *, aging: float | None = None,
           pops_at: float = 0.0, max_queue: int = 100) -> list[str]:
    q = FairQueue(max_queue, aging_seconds=aging)
    for i, (label, flow, tier) in enumerate(arrivals):
        q.push(Demand(flow=flow, tier=tier, weight=(weights or {}).get(flow, 1.0)), now=float(i), token=label)  # type: ignore[arg-type]
    order = []
    while (w := q.pop(pops_at)) is not None:
        order.append(str(w.token))
    return order


def burst(flow: str, n: int, tier: str = "default", prefix: str | None = None) -> list[Arrival]:
    return [(f"{prefix or flow}{i}", flow, tier) for i in range(n)]


@pytest.mark.parametrize(("arrivals", "weights", "expected"), [
    # one flow: first in, first out
    (burst("a", 3), None, ["a0", "a1", "a2"]),
    # a flow arriving behind another's burst goes next, then they alternate
    (burst("a", 4) + burst("b", 2), None, ["a0", "b0", "a1", "b1", "a2", "a3"]),
    # three flows interleave round-robin whatever the arrival order
    (burst("a", 3) + burst("b", 3) + burst("c", 1), None, ["a0", "b0", "c0", "a1", "b1", "a2", "b2"]),
    # weights: b (weight 2) starts two requests for each of a's
    (burst("a", 4) + burst("b", 4), {"b": 2.0}, ["b0", "a0", "b1", "b2", "a1", "b3", "a2", "a3"]),
])
def test_weighted_fair_order_within_a_tier(arrivals: list[Arrival], weights: dict[str, float] | None,
                                           expected: list[str]) -> None:
    assert served(arrivals, weights) == expected


@pytest.mark.parametrize(("arrivals", "expected"), [
    # strict priority: priority before default before flex, whatever the arrival order
    ([("f", "x", "flex"), ("d", "y", "default"), ("p", "z", "priority")], ["p", "d", "f"]),
    # tiers are queues of their own: a flow's priority request passes its own default ones
    (burst("a", 2) + [("ap", "a", "priority")], ["ap", "a0", "a1"]),
    # fairness holds inside each tier
    (burst("a", 2, "priority") + burst("b", 1, "priority") + burst("c", 2), ["a0", "b0", "a1", "c0", "c1"]),
])
def test_strict_priority_between_tiers(arrivals: list[Arrival], expected: list[str]) -> None:
    assert served(arrivals) == expected


@pytest.mark.parametrize(("pops_at", "expected"), [
    # at t=5 no one has waited 10 s: strict priority
    (5.0, ["p0", "p1", "p2", "d", "f"]),
    # at t=11 the flex request (t=0) has aged past 10 s, the default one (t=1) too: oldest first, then priority
    (11.0, ["f", "d", "p0", "p1", "p2"]),
    # at t=10 only the flex request (arrived t=0) has waited 10 s
    (10.0, ["f", "p0", "p1", "p2", "d"]),
])
def test_aging_bounds_the_lowest_tiers_wait(pops_at: float, expected: list[str]) -> None:
    arrivals = [("f", "x", "flex"), ("d", "y", "default")] + burst("z", 3, "priority", prefix="p")
    assert served(arrivals, aging=10.0, pops_at=pops_at) == expected


def test_aging_never_puts_a_flows_old_backlog_before_a_neighbour_of_its_tier() -> None:
    """Issue 38: a flood waiting past aging_seconds went before a neighbour that had just come (oldest
    first), so the neighbour's second request waited behind the whole backlog."""
    q = FairQueue(100, aging_seconds=10.0)
    for i in range(6):
        q.push(Demand(flow="a"), 0.0, f"a{i}")
    assert q.pop(5.0).token == "a0"  # type: ignore[union-attr]
    q.push(Demand(flow="b"), 19.0, "b0")
    assert [str(w.token) for w in q.order(20.0)] == ["b0", "a1"]  # the fair order holds inside the tier
    q.push(Demand(flow="f", tier="flex"), 20.0, "f0")
    assert [str(w.token) for w in q.order(25.0)] == ["b0", "a1", "f0"]
    assert [str(w.token) for w in q.order(30.0)] == ["b0", "a1", "f0"]  # both aged: the oldest tier first


def test_no_aging_is_strict_priority_forever() -> None:
    arrivals = [("f", "x", "flex")] + burst("z", 2, "priority", prefix="p")
    assert served(arrivals, aging=None, pops_at=1e9) == ["p0", "p1", "f"]


def test_a_flow_returning_after_idle_gets_no_credit_for_its_absence() -> None:
    q = FairQueue(100, aging_seconds=None)
    for i in range(3):
        q.push(Demand(flow="a"), 0.0, f"a{i}")
    assert q.pop(0.0).token == "a0"  # type: ignore[union-attr]
    assert q.pop(0.0).token == "a1"  # type: ignore[union-attr]
    for i in range(2):  # b was idle while a was served: it joins at the current virtual time
        q.push(Demand(flow="b"), 1.0, f"b{i}")
    # b0 and b1 take tags 2 and 3 (from the virtual time 1), not 1 and 2: a2 (tag 3, older) goes before b1
    assert [w.token for w in iter(lambda: q.pop(1.0), None)] == ["b0", "a2", "b1"]


@pytest.mark.parametrize(("queued", "arrival", "outcome"), [
    # a full queue refuses the flow holding the most: A's newest waiter makes room for B
    (burst("a", 4), ("b", "default"), ("displaced", "a3", "flow_share")),
    # A's own next request finds A the busiest flow: refused to A
    (burst("a", 4), ("a", "default"), ("refused", "queue_full")),
    # two flows at 2 each: a third flow displaces the newest of the busiest (ties: the newest waiter)
    (burst("a", 2) + burst("b", 2), ("c", "default"), ("displaced", "b1", "flow_share")),
    # a flex waiter is the first refused: any non-flex arrival takes its place
    (burst("a", 1, "flex") + burst("b", 3), ("b", "default"), ("displaced", "a0", "class")),
    # a flex arrival never displaces: refused (unless another flex flow holds more than it would)
    (burst("b", 4), ("c", "flex"), ("refused", "queue_full")),
    (burst("a", 3, "flex") + burst("b", 1), ("c", "flex"), ("displaced", "a2", "flow_share")),
    # a default burst never displaces a priority request
    (burst("a", 4, "priority"), ("b", "default"), ("refused", "queue_full")),
])
def test_a_full_queue_refuses_the_sender_of_the_burst(queued: list[Arrival], arrival: tuple[str, str],
                                                      outcome: tuple[str, ...]) -> None:
    q = FairQueue(len(queued), aging_seconds=None)
    for i, (label, flow, tier) in enumerate(queued):
        q.push(Demand(flow=flow, tier=tier), float(i), label)  # type: ignore[arg-type]
    demand = Demand(flow=arrival[0], tier=arrival[1])  # type: ignore[arg-type]
    if outcome[0] == "refused":
        with pytest.raises(Refused) as refused:
            q.push(demand, 9.0, "new")
        assert refused.value.reason == outcome[1]
        assert len(q) == len(queued)
        return
    _, displaced = q.push(demand, 9.0, "new")
    assert displaced is not None and displaced.token == outcome[1]
    assert q.reason_displaced(displaced, demand) == outcome[2]
    assert len(q) == len(queued) and displaced not in list(q)


def test_weights_count_in_the_share_a_full_queue_refuses() -> None:
    q = FairQueue(4, aging_seconds=None)
    for i in range(3):
        q.push(Demand(flow="a", weight=4.0), float(i), f"a{i}")  # 3 waiting at weight 4: 0.75 per unit
    q.push(Demand(flow="b"), 3.0, "b0")  # 1 at weight 1
    with pytest.raises(Refused):  # b would hold 2 per unit: more than a's 0.75
        q.push(Demand(flow="b"), 4.0, "b1")
    with pytest.raises(Refused):  # c would hold 1 per unit: neither a (0.75) nor b (1) holds more
        q.push(Demand(flow="c"), 5.0, "c0")
    _, displaced = q.push(Demand(flow="c", weight=2.0), 5.0, "c0")  # at weight 2, 0.5: b holds more
    assert displaced is not None and displaced.token == "b0"


def test_per_flow_bound() -> None:
    q = FairQueue(10, max_per_flow=2)
    q.push(Demand(flow="a"), 0.0)
    q.push(Demand(flow="a"), 0.0)
    with pytest.raises(Refused) as refused:
        q.push(Demand(flow="a"), 0.0)
    assert refused.value.reason == "flow_bound"
    q.push(Demand(flow="b"), 0.0)  # another flow is not affected
    assert q.waiting_of("a") == 2 and q.waiting_of("b") == 1 and q.flows == 2


def test_can_start_skips_a_flow_without_losing_its_place() -> None:
    q = FairQueue(10, aging_seconds=None)
    q.push(Demand(flow="doc", prompt_tokens=2000), 0.0, "doc0")
    q.push(Demand(flow="doc", prompt_tokens=2000), 0.0, "doc1")
    q.push(Demand(flow="chat", prompt_tokens=20), 1.0, "chat0")
    short = q.pop(2.0, lambda d: None if d.prompt_tokens < 1000 else "budget")
    assert short is not None and short.token == "chat0"
    assert q.pop(2.0, lambda d: None if d.prompt_tokens < 1000 else "budget") is None
    assert [q.pop(2.0).token, q.pop(2.0).token] == ["doc0", "doc1"]  # type: ignore[union-attr]


def test_removed_waiters_leave_no_trace() -> None:
    q = FairQueue(10, aging_seconds=None)
    waiters = [q.push(Demand(flow="a"), 0.0, f"a{i}")[0] for i in range(3)]
    assert q.remove(waiters[1]) and not q.remove(waiters[1])
    assert q.remove(waiters[2])  # the newest: its virtual time is given back
    q.push(Demand(flow="b"), 1.0, "b0")
    assert [q.pop(1.0).token, q.pop(1.0).token, q.pop(1.0)] == ["a0", "b0", None]  # type: ignore[union-attr]
    assert len(q) == 0 and q.waiting_by_tier() == {"priority": 0, "default": 0, "flex": 0}
