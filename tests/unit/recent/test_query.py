"""Who sees which recent requests, and the filters: table tests of the pure functions."""

from __future__ import annotations

import pytest

from gateway.identity import Caller
from gateway.recent import Filters, RequestFacts, select
from gateway.recent.query import status_matches


def facts(i: int, tenant: str | None, status: int = 200, model: str = "m") -> RequestFacts:
    f = RequestFacts(f"id{i}", 1000.0 + i, "/v1/chat/completions", 0.0)
    f.tenant, f.status, f.model = tenant, status, model
    return f


ROWS = [facts(5, "b", 429), facts(4, "a", 200, "other"), facts(3, None, 401), facts(2, "a", 500), facts(1, "b", 200)]
ADMIN, A = Caller("root", "admin"), Caller("a")


@pytest.mark.parametrize(("wanted", "status", "ok"), [
    (None, 500, True), ("200", 200, True), ("200", 201, False), ("4xx", 429, True), ("4xx", 500, False),
    ("error", 400, True), ("error", 399, False), ("5xx", 503, True),
])
def test_status_filter(wanted: str | None, status: int, ok: bool) -> None:
    assert status_matches(wanted, status) is ok


@pytest.mark.parametrize(("caller", "filters", "ids"), [
    (None, Filters(), ["id5", "id4", "id3", "id2", "id1"]),               # no keys: the gateway is open
    (ADMIN, Filters(), ["id5", "id4", "id3", "id2", "id1"]),
    (A, Filters(), ["id4", "id2"]),                                        # its own tenant only
    (A, Filters(tenant="b"), []),                                         # another tenant: as if none existed
    (A, Filters(id="id5"), []),                                           # another tenant's id: the same
    (A, Filters(id="id-none"), []),
    (A, Filters(id="id2"), ["id2"]),
    (ADMIN, Filters(tenant="b"), ["id5", "id1"]),
    (ADMIN, Filters(status="error"), ["id5", "id3", "id2"]),
    (ADMIN, Filters(model="other"), ["id4"]),
    (ADMIN, Filters(limit=2), ["id5", "id4"]),
    (A, Filters(limit=1), ["id4"]),
])
def test_visibility_and_filters(caller: Caller | None, filters: Filters, ids: list[str]) -> None:
    assert [f.id for f in select(ROWS, caller, filters)] == ids
