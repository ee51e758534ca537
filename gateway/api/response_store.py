"""The stored Responses contract (`store: true`): what `previous_response_id`, GET/DELETE and
input_items read. Implementations: the embedded SQLite file (sqlite_response_store.py) and
PostgreSQL (`database_url`, shared by every gateway that names it), passing one table of tests.

Each record keeps the conversation's full item history (every earlier input and output, in order),
so a continuation reads one row and survives the retention pruning of the responses before it.

Ownership: every record has an owner, the tenant (key name) that created it; `ANONYMOUS` when the
gateway runs without keys; None for a row written before owners were recorded (visible to admins
only). A read or delete names the owner it is for, and a record of another owner answers exactly
as a missing id does; `owner=None` (an admin, or a gateway without keys) reaches every record.
Pruning is per owner: one tenant's writes never evict another's history.

A store lost later answers 503 (`StoreUnavailable`), never 500; one that cannot be used at all
fails start-up (`check()`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

ANONYMOUS = ""
"""The owner of what a gateway without keys stores."""


@dataclass(frozen=True, slots=True)
class StoredResponse:
    id: str
    owner: str | None
    """The tenant that created it (ANONYMOUS without keys; None: written before owners were recorded)."""
    created_at: float
    response: dict[str, Any]
    """The Response object as the client received it."""
    input_items: list[dict[str, Any]]
    """This request's input items (with ids), for GET /v1/responses/{id}/input_items."""
    history: list[dict[str, Any]]
    """Every item of the conversation up to and including this response's output."""


class StoreUnavailable(Exception):
    """The store cannot be read or written (its path is unusable, the disk is gone): the message names the path."""


class IdTaken(Exception):
    """`put` of an id another owner's record holds: that record is never replaced (ids are the gateway's
    or the engine's, so this is an engine repeating an id, not a client's doing)."""


class ResponseStore(Protocol):
    def describe(self) -> str:
        """Where the records live, for the start-up summary."""
        ...

    async def check(self) -> None:
        """Raise StoreUnavailable unless the store can be used (run once at start-up; migrates the schema)."""
        ...

    async def put(self, record: StoredResponse) -> None:
        """Store it (replacing the owner's own record of that id; IdTaken for another owner's), then prune:
        records older than max_age, and the record's owner's oldest beyond max_count."""
        ...

    async def get(self, response_id: str, owner: str | None) -> StoredResponse | None:
        """The record with this id if `owner` owns it (None: any owner); else None, as for a missing id."""
        ...

    async def delete(self, response_id: str, owner: str | None) -> bool:
        """Delete it if `owner` owns it (None: any owner); False, as for a missing id, otherwise."""
        ...

    async def close(self) -> None: ...


def default_store_path() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "enginegate" / "responses.sqlite3"


