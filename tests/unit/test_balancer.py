"""The balancer's decisions, as tables: load, round robin, affinity bounded by load, failover, probes."""

from __future__ import annotations

import collections
import math

import pytest

from gateway.routing.balancer import Balancer, Candidate, bound, rank

A, B, C = "0", "1", "2"


def cands(*loads: int, down: tuple[int, ...] = (), saturated: tuple[int, ...] = (),
          queueing: tuple[int, ...] = ()) -> list[Candidate]:
    return [Candidate(str(i), load, available=i not in down, saturated=i in saturated or i in queueing,
                      queueing=i in queueing) for i, load in enumerate(loads)]


@pytest.mark.parametrize(
    ("loads", "down", "saturated", "expected"),
    [
        ((3, 1, 2), (), (), 1),
        ((0, 5, 5), (0,), (), 1),  # the least loaded is down: the next least
        ((1, 4), (), (0,), 1),  # the least loaded queues: one that does not, though busier
        ((2, 2), (0, 1), (), 0),  # none healthy: the least loaded anyway (no_healthy)
    ],
)
def test_least_outstanding(loads: tuple[int, ...], down: tuple[int, ...], saturated: tuple[int, ...], expected: int) -> None:
    choice = Balancer().choose(cands(*loads, down=down, saturated=saturated))
    assert choice is not None and choice.index == expected
    assert choice.reason == ("no_healthy" if len(down) == len(loads) else "least_outstanding")


def test_least_outstanding_ties_rotate() -> None:
    balancer = Balancer()
    picks = [balancer.choose(cands(0, 0, 0)).index for _ in range(6)]  # type: ignore[union-attr]
    assert sorted(collections.Counter(picks).values()) == [2, 2, 2]


def test_engine_reported_load_counts_when_higher() -> None:
    # replica 0 has one of ours but its (shared) engine runs 10 more: replica 1 is less loaded
    candidates = [Candidate(A, 1, engine_load=11), Candidate(B, 2, engine_load=2)]
    assert Balancer().choose(candidates).index == 1  # type: ignore[union-attr]


def test_round_robin_skips_unavailable() -> None:
    balancer = Balancer("round_robin")
    picks = [balancer.choose(cands(9, 0, 0, down=(1,))) for _ in range(4)]
    assert [p.index for p in picks] == [0, 2, 0, 2]  # type: ignore[union-attr]
    assert {p.reason for p in picks} == {"round_robin"}  # type: ignore[union-attr]


def test_rank_is_stable_and_a_removed_replica_moves_only_its_keys() -> None:
    names = [A, B, C]
    keys = [f"session-{i}" for i in range(300)]
    homes = {k: names[rank(k, names)[0]] for k in keys}
    assert rank("x", names) == rank("x", names)
    share = collections.Counter(homes.values())
    assert min(share.values()) > 60  # about a third each (rendezvous hashing is uniform)
    without_c = [A, B]
    for k in keys:
        home = without_c[rank(k, without_c)[0]]
        if homes[k] != C:
            assert home == homes[k]  # keys not on the removed replica stay where they were
        else:  # its keys go to their second choice
            assert home == names[rank(k, names)[1]]


def test_affinity_keeps_a_key_home_while_under_its_bound() -> None:
    balancer = Balancer(affinity="session")
    home = rank("alice", [A, B])[0]
    for load in range(3):
        loads = [0, 0]
        loads[home] = load
        loads[1 - home] = 2  # the other replica is as busy: alice stays home
        choice = balancer.choose(cands(*loads), key="alice")
        assert choice is not None and (choice.index, choice.reason) == (home, "affinity")


@pytest.mark.parametrize(("total", "usable", "factor", "expected"), [(0, 2, 1.25, 1), (1, 2, 1.25, 2), (2, 2, 1.25, 2),
                                                                       (7, 2, 1.25, 5), (8, 4, 1.0, 3), (0, 1, 2.0, 2)])
def test_bound(total: int, usable: int, factor: float, expected: int) -> None:
    loads = [total] + [0] * (usable - 1)
    assert bound(cands(*loads), list(range(usable)), factor) == expected == max(1, math.ceil(factor * (total + 1) / usable))


def test_one_hot_prefix_spreads_within_the_bound() -> None:
    """Every request carries the same key (one shared system prompt) and none finishes: load still spreads."""
    balancer = Balancer(affinity="prefix", load_factor=1.25)
    loads = [0, 0, 0]
    reasons: collections.Counter[str] = collections.Counter()
    for _ in range(30):
        choice = balancer.choose(cands(*loads), key="the-one-system-prompt")
        assert choice is not None
        loads[choice.index] += 1
        reasons[choice.reason] += 1
        assert max(loads) <= math.ceil(1.25 * sum(loads) / 3)  # no replica above its share plus the margin
    first, second, third = rank("the-one-system-prompt", [A, B, C])
    cap = math.ceil(1.25 * 30 / 3)
    # the key's first two choices fill to the bound, the third takes the rest: the prefix is cached
    # on as few replicas as the bound allows, and no replica holds more than its share plus 25 %
    assert (loads[first], loads[second], loads[third]) == (cap, cap, 30 - 2 * cap)
    assert reasons["affinity"] == cap and reasons["affinity_spill"] == 30 - cap


def test_affinity_fails_over_to_the_keys_next_choice_and_comes_back() -> None:
    balancer = Balancer(affinity="session")
    order = rank("bob", [A, B, C])
    down = balancer.choose(cands(0, 0, 0, down=(order[0],)), key="bob")
    assert down is not None and (down.index, down.reason) == (order[1], "affinity_failover")
    back = balancer.choose(cands(0, 0, 0), key="bob")
    assert back is not None and (back.index, back.reason) == (order[0], "affinity")


def test_affinity_spills_from_a_queueing_home_while_another_is_calm() -> None:
    balancer = Balancer(affinity="prefix")
    home = rank("k", [A, B])[0]
    busy = balancer.choose(cands(0, 0, saturated=(home,)), key="k")  # slots busy, nobody waiting: wait at home
    assert busy is not None and (busy.index, busy.reason) == (home, "affinity")
    spill = balancer.choose(cands(0, 0, queueing=(home,)), key="k")
    assert spill is not None and (spill.index, spill.reason) == (1 - home, "affinity_spill")
    both = balancer.choose(cands(0, 0, queueing=(0, 1)), key="k")  # everyone queues: stay home (the cache)
    assert both is not None and (both.index, both.reason) == (home, "affinity")


def test_no_key_balances_by_load() -> None:
    choice = Balancer(affinity="prefix").choose(cands(4, 1))
    assert choice is not None and (choice.index, choice.reason) == (1, "least_outstanding")


def test_a_half_open_replica_gets_one_probe_first() -> None:
    candidates = [Candidate(A, 0), Candidate(B, 3, probe=True)]
    choice = Balancer(affinity="session").choose(candidates, key="carol")
    assert choice is not None and (choice.index, choice.reason) == (1, "probe")


def test_nothing_to_choose() -> None:
    assert Balancer().choose([]) is None
