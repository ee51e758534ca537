"""Where the gateway keeps what it builds and logs: `$ENGINEGATE_CACHE` or `~/.cache/enginegate`."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TextIO

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


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


def open_private_log(path: Path) -> TextIO:
    """Append to an engine's log, readable by the gateway's user alone: engines log what clients send
    (prompts, tool JSON). A folder made here is 0700, and the gateway's own `logs_dir()` is tightened to
    0700 when an older gateway left it wider; the file is created 0600, or tightened to it."""
    folder = path.parent
    if not folder.is_dir():
        folder.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
        folder.chmod(PRIVATE_DIR)  # mkdir's mode is filtered by the umask
    elif folder.resolve() == logs_dir().resolve() and folder.stat().st_mode & 0o077:
        folder.chmod(PRIVATE_DIR)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, PRIVATE_FILE)
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, PRIVATE_FILE)
        return os.fdopen(fd, "a", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise
