"""The adapter routing rule: a replica with the adapter loaded unless it is a whole round of slots busier."""

from __future__ import annotations

import pytest

from gateway.lora.routing import AdapterPlace, choose


def place(outstanding: int, loaded: bool, slots: int | None = 4, available: bool = True) -> AdapterPlace:
    return AdapterPlace(outstanding, slots, loaded, available)


@pytest.mark.parametrize(("places", "chosen", "expected"), [
    ([place(0, True), place(0, False)], 0, (0, None)),  # the balancer's choice has it: kept
    ([place(3, True), place(0, False)], 1, (0, "adapter_loaded")),  # 0.75 rounds busier: go where it is loaded
    ([place(4, True), place(0, False)], 1, (0, "adapter_loaded")),  # exactly one round: still loaded (<=)
    ([place(5, True), place(0, False)], 1, (1, "adapter_load")),  # more than a round busier: load it there
    ([place(2, True, slots=1), place(0, False, slots=1)], 1, (1, "adapter_load")),  # 2 rounds on a 1-slot engine
    ([place(6, True), place(2, True), place(1, False)], 2, (1, "adapter_loaded")),  # the least busy of the loaded
    ([place(0, True, available=False), place(3, False)], 1, (1, None)),  # a down replica is no candidate
    ([place(1, False), place(0, False)], 1, (1, None)),  # nowhere loaded: the balancer's choice
    ([place(2, True, slots=None), place(0, False, slots=None)], 1, (1, "adapter_load")),  # no cap: one slot
])
def test_adapter_choice(places: list[AdapterPlace], chosen: int, expected: tuple[int, str | None]) -> None:
    assert choose(places, chosen) == expected
