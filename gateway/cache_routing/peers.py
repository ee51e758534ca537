"""What gateways in front of the same replicas tell each other: where each one placed a prompt.

A gateway's prefix index learns a replica's cache from the requests it sent there. Several gateways in
front of the same replicas each see only their part of the traffic, so a conversation whose turns
alternate between them would find, at each gateway, an index that never saw its other turns, and be
recomputed on the other replica. So each gateway publishes a `Note` per placement (the replica's shared
name and the prompt's block chain) and every other gateway applies it to its own index of that replica,
as if it had placed the request itself (gateway/cache_routing/peering.py carries them).

Only a replica at an external URL has a name every gateway agrees on (its base URL): a replica a gateway
supervises is its own engine, held by no other gateway, and is never named. Pure: encoding, decoding (a
malformed note is None) and which replica a note names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import orjson

from gateway.cache_routing.blocks import BLOCK_CHARS, MAX_CHARS

VERSION = 1
MAX_BLOCKS = MAX_CHARS // 8
"""The longest chain a note may carry (a prompt's first MiB in blocks of the smallest `block_chars`, 8)."""
HASH_LIMIT = 1 << 64


@dataclass(frozen=True, slots=True)
class Note:
    sender: str
    """The gateway that placed the request (a random id per process)."""
    replica: str
    """The replica's shared name: its base URL."""
    block_chars: int
    """The sender's block size: a gateway configured with another one cuts other blocks, and ignores the note."""
    blocks: tuple[int, ...]


def shared_name(described: Mapping[str, object], incarnation: object) -> str | None:
    """The name every gateway gives this replica (its base URL without credentials, query or a trailing slash), or None: a
    replica this gateway supervises (it has an incarnation) is its own, whatever URL it listens on."""
    url = described.get("base_url")
    if incarnation is not None or not isinstance(url, str) or not url:
        return None
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]  # credentials in the URL never leave in a note
    return urlunsplit((parts.scheme.lower(), host.lower(), parts.path.rstrip("/"), "", ""))


def encode(note: Note) -> bytes:
    return orjson.dumps({"v": VERSION, "g": note.sender, "r": note.replica, "c": note.block_chars,
                         "b": list(note.blocks[:MAX_BLOCKS])})


def decode(raw: bytes | str, block_chars: int = BLOCK_CHARS) -> Note | None:
    """The note in `raw`, or None: not a note of this version, cut in other blocks, or malformed."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict) or data.get("v") != VERSION:
        return None
    sender, replica, chars, blocks = data.get("g"), data.get("r"), data.get("c"), data.get("b")
    if not isinstance(sender, str) or not sender or not isinstance(replica, str) or not replica:
        return None
    if chars != block_chars or not isinstance(blocks, list) or len(blocks) > MAX_BLOCKS:
        return None
    if not all(type(b) is int and 0 <= b < HASH_LIMIT for b in blocks):
        return None
    return Note(sender, replica, block_chars, tuple(blocks))


def addressed(note: Note, names: Sequence[str | None]) -> int | None:
    """The index of the replica `note` names among this gateway's replicas' shared names (None: not one of ours)."""
    for i, name in enumerate(names):
        if name is not None and name == note.replica:
            return i
    return None
