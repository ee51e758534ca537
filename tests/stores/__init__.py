"""Every ResponseStore implementation the contract tests (tests/unit/stores) run against.

A factory opens a store whose records live at `place`, a folder of the test's own: two stores
opened at one place see the same records (a restarted gateway, or a second gateway sharing them).
A new implementation is one line in RESPONSE_STORES."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from gateway.api.response_store import ResponseStore
from gateway.api.sqlite_response_store import SQLiteResponseStore


class ResponseStoreFactory(Protocol):
    def __call__(self, place: Path, *, max_age_s: float, max_count: int) -> ResponseStore: ...


def make_sqlite(place: Path, *, max_age_s: float, max_count: int) -> ResponseStore:
    return SQLiteResponseStore(place / "responses.sqlite3", max_age_s, max_count)


RESPONSE_STORES: dict[str, ResponseStoreFactory] = {"sqlite": make_sqlite}
