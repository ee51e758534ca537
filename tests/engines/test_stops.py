from __future__ import annotations

import pytest

from adapters.stops import StopMatcher, stop_list


def run(stops: tuple[str, ...], segments: list[str]) -> tuple[list[str], bool]:
    m = StopMatcher(stops)
    out = [m.feed(s) for s in segments]
    out.append(m.flush())
    return out, m.stopped


def test_no_stops_passes_everything_through() -> None:
    assert run((), ["a", "b"]) == (["a", "b", ""], False)


def test_a_stop_inside_one_segment_cuts_it() -> None:
    assert run(("END",), ["abcENDxyz", "more"]) == (["abc", "", ""], True)


def test_a_stop_split_across_segments_is_held_back_then_cut() -> None:
    out, stopped = run(("END",), ["abE", "N", "Dzz"])
    assert out == ["ab", "", "", ""] and stopped


def test_a_false_start_is_released_when_it_cannot_be_a_stop() -> None:
    out, stopped = run(("END",), ["abE", "Nx", "y"])
    assert "".join(out) == "abENxy" and not stopped
    assert out[0] == "ab"


def test_held_text_is_flushed_at_the_end() -> None:
    assert run(("END",), ["abEN"]) == (["ab", "EN"], False)


def test_the_earliest_of_several_stops_wins() -> None:
    assert run(("zz", "b"), ["abczz"])[0][0] == "a"


@pytest.mark.parametrize("value, expected", [(None, ()), ("x", ("x",)), (["a", "", "b"], ("a", "b")), ("", ())])
def test_stop_list(value: object, expected: tuple[str, ...]) -> None:
    assert stop_list(value) == expected


def test_stop_list_rejects_other_types() -> None:
    with pytest.raises(ValueError):
        stop_list([1, 2])
