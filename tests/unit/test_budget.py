"""The memory budget's decisions: a table of residents and a load, and what the budget decides."""

from __future__ import annotations

import pytest

from gateway.routing.budget import Fit, Refuse, Resident, Wait, decide, differs, never_fits, pinned_overflow

MB = 2**20
CAP = {"ram": 300 * MB}


def r(name: str, mb: int, used: float, **flags: bool) -> Resident:
    return Resident(name, {"ram": mb * MB}, last_used=used, **flags)


@pytest.mark.parametrize(
    ("residents", "need_mb", "expected"),
    [
        pytest.param([], 100, Fit(), id="empty budget: fits"),
        pytest.param([r("a", 100, 1)], 100, Fit(), id="room left: no eviction"),
        pytest.param([r("a", 100, 2), r("b", 100, 1)], 150, Fit(("b",)), id="least recently used goes first"),
        pytest.param([r("a", 100, 1), r("b", 100, 2)], 150, Fit(("a",)), id="LRU, the other order"),
        pytest.param([r("a", 100, 1), r("b", 100, 2)], 250, Fit(("a", "b")), id="evicts until it fits"),
        pytest.param([r("a", 100, 1, pinned=True), r("b", 100, 2)], 150, Fit(("b",)), id="pinned is never evicted"),
        pytest.param([r("a", 150, 1, pinned=True), r("b", 150, 2, pinned=True)], 100, Refuse, id="pinned hold it: refuse"),
        pytest.param([r("a", 200, 1, busy=True)], 150, Wait, id="busy holds it: wait and drain"),
        pytest.param([r("a", 200, 1, protected=True)], 150, Wait, id="just swapped in: wait, no drain"),
        pytest.param([r("a", 200, 1, pinned=True), r("b", 100, 2, busy=True)], 150, Refuse,
                     id="busy would not free enough beside pinned: refuse"),
        pytest.param([r("a", 50, 1), r("b", 200, 2, busy=True)], 100, Fit(("a",)), id="idle one evicted, busy one kept"),
        pytest.param([], 400, Refuse, id="larger than the budget: refuse"),
    ],
)
def test_decide(residents: list[Resident], need_mb: int, expected: object) -> None:
    decision = decide("new", {"ram": need_mb * MB}, CAP, residents)
    if isinstance(expected, type):
        assert isinstance(decision, expected), decision
    else:
        assert decision == expected


def test_wait_drains_busy_models_but_not_just_swapped_in_ones() -> None:
    busy = decide("new", {"ram": 150 * MB}, CAP, [r("a", 200, 1, busy=True)])
    assert isinstance(busy, Wait) and busy.drain == ("a",)
    protected = decide("new", {"ram": 150 * MB}, CAP, [r("a", 200, 1, protected=True)])
    assert isinstance(protected, Wait) and protected.drain == ()


def test_refusal_names_the_figures_and_who_holds_the_memory() -> None:
    decision = decide("new", {"ram": 150 * MB}, CAP, [r("a", 200, 1, pinned=True)])
    assert isinstance(decision, Refuse)
    assert "pinned" in decision.reason and "a holds 200 MiB (pinned)" in decision.reason
    assert "new needs 150 MiB of ram (300 MiB budget)" in decision.reason


def test_only_models_in_the_short_pool_are_evicted() -> None:
    cap = {"gpu:0": 100 * MB, "gpu:1": 100 * MB}
    on0 = Resident("on0", {"gpu:0": 80 * MB}, last_used=1)
    on1 = Resident("on1", {"gpu:1": 80 * MB}, last_used=0)
    assert decide("new", {"gpu:0": 50 * MB}, cap, [on0, on1]) == Fit(("on0",))


def test_a_pool_without_a_budget_is_not_counted() -> None:
    assert decide("new", {"gpu:3": 10**15}, CAP, []) == Fit()


def test_the_model_itself_is_not_its_own_rival() -> None:
    assert decide("a", {"ram": 200 * MB}, CAP, [r("a", 200, 1, busy=True)]) == Fit()


@pytest.mark.parametrize(
    ("need", "cap", "fits"),
    [({"ram": 100}, {"ram": 100}, True), ({"ram": 101}, {"ram": 100}, False), ({"gpu:0": 5}, {"ram": 1}, True)],
)
def test_never_fits(need: dict[str, int], cap: dict[str, int], fits: bool) -> None:
    assert (never_fits(need, cap) is None) is fits


def test_pinned_overflow() -> None:
    assert pinned_overflow({"a": {"ram": 60}, "b": {"ram": 40}}, {"ram": 100}) is None
    why = pinned_overflow({"a": {"ram": 60}, "b": {"ram": 50}}, {"ram": 100})
    assert why is not None and "pinned models need" in why and "a " in why and "b " in why


@pytest.mark.parametrize(("estimate", "measured", "off"), [(100, 100, False), (120, 100, False), (121, 100, True),
                                                            (79, 100, True), (100, 0, False)])
def test_differs_by_more_than_a_fifth(estimate: int, measured: int, off: bool) -> None:
    assert differs(estimate, measured) is off
