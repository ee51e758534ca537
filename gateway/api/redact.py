"""What a caller who is not an operator may see of the host: engine process ids, ports, URLs and
the host's file paths are an operator's (an admin key, or a gateway without keys), never a tenant's
or an anonymous client's of /ready."""

from __future__ import annotations

import re
from typing import Any

_INTERNAL = re.compile(r"\b(pid|port)\s+\d+|\b[a-z][a-z0-9+.-]*://[^\s)\"',]+")
_PATH = re.compile(r"(?<![\w:/.~-])~?(?:/[\w.@+~-]+){2,}/?")
"""An absolute (or ~/) path of two or more parts: /home/u/models/x.gguf, ~/.cache/enginegate/logs."""


def hide_internals(text: str) -> str:
    """`pid 4242` -> `pid *`, URLs and paths -> `*`."""
    text = _INTERNAL.sub(lambda m: f"{m.group(1)} *" if m.group(1) else "*", text)
    return _PATH.sub("*", text)


def hide_in(value: Any) -> Any:
    """hide_internals on every string inside `value` (dicts, lists)."""
    if isinstance(value, str):
        return hide_internals(value)
    if isinstance(value, dict):
        return {k: hide_in(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [hide_in(v) for v in value]
    return value
