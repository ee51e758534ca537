"""Gateways in front of the same replicas agree on where a prefix lives: the placement notes (pure), and
routers (`Backend`s standing for gateways) that exchange them. The feed over a real redis-server and two
real gateway processes: tests/integration/test_cache_peers_real.py."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.cache_routing.blocks import chain, prompt_text
from gateway.cache_routing.peers import (
    MAX_BLOCKS,
    Note,
    addressed,
    decode,
    encode,
    shared_name,
)
from gateway.config import RoutingConfig
from gateway.request_view import view_of
from gateway.routing import Admission, Backend, Lease, Replica, RouteKey
from gateway.routing.health import Breaker
from tests.fakes import EchoAdapter

URLS = ("http://10.0.0.5:8080", "http://10.0.0.6:8080")
SYSTEM = {"role": "system", "content": "You are terse. " * 40}


class External(EchoAdapter):
    """An upstream at a URL (no incarnation), whose reachability the test sets."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        self.up = True

    def ready_now(self) -> bool | None:
        return self.up

    def describe(self) -> dict[str, Any]:
        return {"engine": "openai", "base_url": self.url}


class Gateway:
    """One gateway's router over the shared replicas; `notes` collects what it would publish."""

    def __init__(self, slots: int = 2, **routing: object) -> None:
        replicas = [Replica(External(url), Admission(slots, 8), name=str(i), breaker=Breaker(1, 10.0))
                    for i, url in enumerate(URLS)]
        self.backend = Backend(model_id="m", adapter=replicas[0].adapter, admission=replicas[0].admission,
                               replicas=replicas, routing=RoutingConfig.model_validate(routing))
        self.notes: list[Note] = []
        self.backend.peers = _Recorder(self.notes)  # type: ignore[assignment]

    async def send(self, body: dict[str, Any], hold: bool = False) -> tuple[int, str, Lease]:
        text = prompt_text(view_of(body))
        assert text is not None
        lease = await self.backend.acquire(RouteKey(blocks=chain(text, 64), text=text))
        if not hold:
            lease.release()
        return int(lease.replica.name), lease.reason, lease

    def hear(self, other: Gateway) -> None:
        """Apply what `other` published (as the listener does with the channel's messages)."""
        for note in other.notes:
            decoded = decode(encode(note))
            assert decoded is not None
            self.backend._placed_by_peer(decoded)
        other.notes.clear()

    def replica(self, i: int) -> External:
        adapter = self.backend.replicas[i].adapter
        assert isinstance(adapter, External)
        return adapter


class _Recorder:
    def __init__(self, notes: list[Note]) -> None:
        self.notes = notes

    def publish(self, replica: str, blocks: tuple[int, ...]) -> None:
        self.notes.append(Note("sender", replica, 64, tuple(blocks)))


def conversation(doc: str, turns: int) -> dict[str, Any]:
    messages: list[dict[str, str]] = [SYSTEM, {"role": "user", "content": f"{doc} " * 60}]
    for t in range(1, turns):
        messages += [{"role": "assistant", "content": f"answer {t} " * 10}, {"role": "user", "content": f"turn {t} " * 10}]
    return {"messages": messages}


def test_a_note_round_trips_and_names_one_replica() -> None:
    note = Note("g1", URLS[1], 64, (0, 1, (1 << 64) - 1))
    assert decode(encode(note)) == note
    assert addressed(note, [URLS[0], URLS[1]]) == 1 and addressed(note, [URLS[0], None]) is None


@pytest.mark.parametrize("raw", [
    b"not json", b"[]", b'{"v": 2, "g": "g", "r": "u", "c": 64, "b": []}',
    b'{"v": 1, "g": "", "r": "u", "c": 64, "b": []}', b'{"v": 1, "g": "g", "r": "", "c": 64, "b": []}',
    b'{"v": 1, "g": "g", "r": "u", "c": 32, "b": [1]}',  # cut in other blocks: other hashes
    b'{"v": 1, "g": "g", "r": "u", "c": 64, "b": [-1]}', b'{"v": 1, "g": "g", "r": "u", "c": 64, "b": [1.5]}',
    b'{"v": 1, "g": "g", "r": "u", "c": 64, "b": [true]}', b'{"v": 1, "g": "g", "r": "u", "c": 64, "b": "12"}',
    b'{"v": 1, "g": "g", "r": "u", "c": 64, "b": [' + b",".join([b"1"] * (MAX_BLOCKS + 1)) + b"]}",
])
def test_a_malformed_note_is_none(raw: bytes) -> None:
    assert decode(raw) is None


@pytest.mark.parametrize(("described", "incarnation", "name"), [
    ({"base_url": "http://10.0.0.5:8080/"}, None, "http://10.0.0.5:8080"),
    ({"base_url": "HTTP://User:secret@Host:8080/v1/?x=1"}, None, "http://host:8080/v1"),  # never the password
    ({"base_url": "http://127.0.0.1:9000"}, (1234, 0), None),  # a supervised engine: this gateway's own
    ({}, None, None),
])
def test_only_an_external_replica_has_a_shared_name(described: dict[str, Any], incarnation: object,
                                                    name: str | None) -> None:
    assert shared_name(described, incarnation) == name


async def busy(gw: Gateway, i: int) -> Any:
    """A request of some other client holding a slot of replica i at this gateway (the cost goes elsewhere)."""
    admission = gw.backend.replicas[i].admission
    ticket = await admission.acquire()
    return lambda: admission.release(ticket)


async def place(gw: Gateway, body: dict[str, Any], i: int) -> None:
    """Send a new conversation's first turn while the other replica's slots are all busy, so it lands on replica i."""
    frees = [await busy(gw, 1 - i) for _ in range(gw.backend.replicas[1 - i].admission.concurrency or 1)]
    assert (await gw.send(body))[0] == i
    for free in frees:
        free()


async def test_the_second_gateway_sends_a_turn_where_the_first_placed_the_conversation() -> None:
    a, b, deaf = Gateway(), Gateway(), Gateway()
    await place(a, conversation("X", 1), 1)
    # without A's notes, B has never seen X: it sends X's second turn to its least loaded, replica 0
    assert (await deaf.send(conversation("X", 2)))[:2] == (0, "cache_cold")
    b.hear(a)
    assert (await b.send(conversation("X", 2)))[:2] == (1, "cache_hit")
    a.hear(b)  # and A, hearing B, finds X's third turn there
    assert (await a.send(conversation("X", 3)))[:2] == (1, "cache_hit")


async def test_gateways_fed_the_same_notes_choose_the_same_replica() -> None:
    a, b, c = Gateway(), Gateway(), Gateway()
    for i in range(6):
        await place(a, conversation(f"conv{i}", 1), i % 2)
    b.notes = list(a.notes)
    c.notes = list(a.notes)
    b.hear(b)
    c.hear(c)
    chosen = [(await b.send(conversation(f"conv{i}", 2)))[:2] for i in range(6)]
    assert chosen == [(await c.send(conversation(f"conv{i}", 2)))[:2] for i in range(6)]
    assert chosen == [(i % 2, "cache_hit") for i in range(6)]


async def test_the_load_bound_holds_against_what_peers_placed() -> None:
    a, b = Gateway(slots=4), Gateway(slots=4)
    await place(a, conversation("X", 1), 1)
    b.hear(a)
    held = [(await b.send(conversation("X", 2), hold=True)) for _ in range(3)]
    assert [h[:2] for h in held[:2]] == [(1, "cache_hit")] * 2  # the bound: ceil(1.25 * 3 / 2) = 2 at home
    assert held[2][:2] == (0, "cache_load")


async def test_a_replica_down_moves_its_conversations_and_only_its() -> None:
    a, b = Gateway(), Gateway()
    await place(a, conversation("X", 1), 0)
    await place(a, conversation("Y", 1), 1)
    b.hear(a)
    b.replica(0).up = False  # X's replica goes down
    assert (await b.send(conversation("X", 2)))[0] == 1  # X moves
    assert (await b.send(conversation("Y", 2)))[:2] == (1, "cache_hit")  # Y stays where it was
    b.replica(0).up = True
    # back up: X's later turns stay where its prefix now is (moving back would compute it again)
    assert (await b.send(conversation("X", 3)))[:2] == (1, "cache_hit")
    free = await busy(b, 1)
    assert (await b.send(conversation("Z", 1)))[0] == 0  # and a new conversation goes there again
    free()


@pytest.mark.parametrize(("url", "ok"), [
    ("redis://10.0.0.7:6379/0", True), ("rediss://:pw@r.example:6380/1", True), ("unix:///run/redis.sock", True),
    ("http://10.0.0.7:6379", False), ("10.0.0.7:6379", False),
])
def test_cache_peers_is_a_redis_url(url: str, ok: bool) -> None:
    from pydantic import ValidationError

    if ok:
        assert RoutingConfig(cache_peers=url).cache_peers == url
    else:
        with pytest.raises(ValidationError, match="cache_peers is a Redis URL"):
            RoutingConfig(cache_peers=url)
