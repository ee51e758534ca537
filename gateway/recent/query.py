"""Who sees which recent requests, and the filters of GET /admin/requests: pure functions.

Visibility: without keys every row (the gateway is open); an admin key every row; any other key only
its own tenant's rows. Another tenant's rows are filtered out the same way a filter that matches
nothing is, so a tenant cannot tell whether they exist (an id or tenant it names answers an empty list)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from gateway.identity import Caller
from gateway.recent.facts import RequestFacts

MAX_LIMIT = 1000
DEFAULT_LIMIT = 100


@dataclass(frozen=True, slots=True)
class Filters:
    limit: int = DEFAULT_LIMIT
    model: str | None = None
    tenant: str | None = None
    status: str | None = None
    """An exact code (429), a class (4xx), or `error` (any status of 400 and above)."""
    id: str | None = None


def status_matches(wanted: str | None, status: int) -> bool:
    if wanted is None:
        return True
    if wanted == "error":
        return status >= 400
    if len(wanted) == 3 and wanted.endswith("xx") and wanted[0].isdigit():
        return status // 100 == int(wanted[0])
    return str(status) == wanted


def may_see(caller: Caller | None, facts: RequestFacts) -> bool:
    return caller is None or caller.is_admin or facts.tenant == caller.name


def matches(f: Filters, facts: RequestFacts) -> bool:
    return ((f.id is None or facts.id == f.id) and (f.model is None or facts.model == f.model)
            and (f.tenant is None or facts.tenant == f.tenant) and status_matches(f.status, facts.status))


def select(rows: Iterable[RequestFacts], caller: Caller | None, f: Filters) -> Iterator[RequestFacts]:
    """The rows `caller` may see that match `f`, at most `f.limit`, in the order given (newest first)."""
    n = 0
    for facts in rows:
        if n >= f.limit:
            return
        if may_see(caller, facts) and matches(f, facts):
            n += 1
            yield facts
