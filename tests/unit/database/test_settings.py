"""`database_url`: read from the environment, PostgreSQL URLs only, a clear word when the driver is missing."""

from __future__ import annotations

import importlib.util

import pytest
from pydantic import ValidationError

from gateway.app import open_database
from gateway.config import Settings


def test_the_environment_names_the_database(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGINEGATE_DATABASE_URL", "postgresql://eg:pw@db:5432/enginegate")
    settings = Settings()
    assert settings.database_url == "postgresql://eg:pw@db:5432/enginegate"
    db = open_database(settings)
    assert db is not None and db.timeout_s == settings.tenancy.store_timeout_seconds
    assert db.describe() == "postgresql://eg@db:5432/enginegate (PostgreSQL)"


def test_unset_means_the_sqlite_files() -> None:
    assert Settings().database_url is None and open_database(Settings()) is None


@pytest.mark.parametrize("url", ["mysql://eg@db/x", "sqlite:///x.db", "db:5432", ""])
def test_only_postgresql_urls(url: str) -> None:
    with pytest.raises(ValidationError, match="database_url must be a PostgreSQL URL"):
        Settings(database_url=url)


def test_a_missing_driver_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "asyncpg" else real(name, *a))
    with pytest.raises(ValidationError, match=r"pip install 'enginegate\[postgres\]'"):
        Settings(database_url="postgresql://eg@db/x")
