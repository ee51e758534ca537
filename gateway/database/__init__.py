"""The shared PostgreSQL database (`database_url`): one connection pool per gateway process, shared by
every store that lives there, and the versioned schema each of them migrates at start-up."""

from gateway.database.migrate import migrate
from gateway.database.pool import Database, DatabaseUnavailable, redact

__all__ = ["Database", "DatabaseUnavailable", "migrate", "redact"]
