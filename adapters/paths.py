"""Where the gateway keeps what it builds and logs: `$ENGINEGATE_CACHE` or `~/.cache/enginegate`."""

from __future__ import annotations

import os
import re
from pathlib import Path


def cache_dir() -> Path:
    env = os.environ.get("ENGINEGATE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "enginegate"


def bin_dir() -> Path:
    return cache_dir() / "bin"


def logs_dir() -> Path:
    return cache_dir() / "logs"


def engine_log_path(engine: str, served: str) -> Path:
    """One log file per engine instance, named so the CLI can find it by served model id."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", served).strip("_") or "model"
    return logs_dir() / f"{safe}.{engine}.log"
