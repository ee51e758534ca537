"""One replica's cache as the router tracks it: its prefix index, its slots, and what it measures.

Concurrency rule: everything here runs on the event loop, between the balancer's choice and the
end of the request's lease; nothing awaits except `PreciseCache.matched_tokens`, which the router
awaits before it chooses.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from adapters.base import Usage
from gateway.cache_routing.blocks import BLOCK_CHARS
from gateway.cache_routing.cost import Place
from gateway.cache_routing.index import Correction, PrefixIndex
from gateway.cache_routing.precise import PreciseCache
from gateway.cache_routing.slots import SlotMap

PREFILL_PRIOR = 200.0
"""Prompt tokens per second assumed until the replica's first measured prefill."""
SERVICE_PRIOR = 2.0
"""Seconds a request is assumed to hold a slot until the first one ends."""
CHARS_PER_TOKEN_PRIOR = 4.0
SMOOTHING = 0.2
MIN_MEASURED_TOKENS = 32
"""A prefill shorter than this says more about the engine's per-request overhead than its rate."""


@dataclass(slots=True)
class Ewma:
    value: float
    seen: int = 0

    def update(self, sample: float) -> None:
        self.value = sample if self.seen == 0 else self.value + SMOOTHING * (sample - self.value)
        self.seen += 1


@dataclass(slots=True)
class Placement:
    """What the router predicted for one request at one replica, to check against the engine's report."""

    blocks: tuple[int, ...]
    text: str
    predicted: int
    """Leading blocks the index held when it chose."""
    precise_tokens: int | None = None
    slot: int | None = None
    dispatched: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    done: bool = False
    reported: bool = False


@dataclass(slots=True)
class Counts:
    """For /metrics and the stats: the index's verdicts and the tokens the engine said it reused."""

    right: int = 0
    over: int = 0
    under: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0


class ReplicaCache:
    def __init__(self, index_blocks: int, block_chars: int = BLOCK_CHARS, slots: int | None = None,
                 precise: PreciseCache | None = None) -> None:
        self.block_chars = block_chars
        self.index = PrefixIndex(index_blocks)
        self.slots = SlotMap(slots, block_chars) if slots else None
        self.precise = precise
        self.prefill_rate = Ewma(PREFILL_PRIOR)
        self.service = Ewma(SERVICE_PRIOR)
        self.chars_per_token = Ewma(CHARS_PER_TOKEN_PRIOR)
        self.counts = Counts()
        self._incarnation: object = None

    def follow(self, incarnation: object) -> None:
        """Its engine's incarnation now: a new one (a restart) holds nothing of what the old one did."""
        if incarnation != self._incarnation:
            if self._incarnation is not None:
                self.reset()
            self._incarnation = incarnation

    def reset(self) -> None:
        """Forget the approximate index and the slots. Not the precise view: it follows the engine's
        launches itself (each publishes on its own socket and starts an empty index), and by the time
        a request sees the new incarnation it has often caught up with the new launch already;
        resetting it would blind it until it subscribed again, so that request fell back to guessing."""
        self.index.clear()
        if self.slots is not None:
            self.slots.clear()

    def place(self, blocks: tuple[int, ...], text: str, outstanding: int, engine_load: float, slots: int | None,
              precise_tokens: int | None = None, prompt_tokens: int | None = None) -> tuple[Place, Placement]:
        """The cost's view of this replica for a prompt, and the prediction to check later."""
        chars = len(text)
        predicted = self.index.match(blocks)
        cpt = self.chars_per_token.value
        matched = float(precise_tokens) if precise_tokens is not None else predicted * self.block_chars / cpt
        placement = Placement(blocks, text, predicted, precise_tokens)
        evicted = self.index.overflow(blocks, predicted) * self.block_chars / cpt
        return Place(outstanding, engine_load, slots, matched, prompt_tokens or chars / cpt, self.prefill_rate.value,
                     self.service.value, evicted), placement

    def chosen(self, placement: Placement) -> None:
        """The request goes here: its prompt will be in this engine's cache (what SGLang's router
        assumes at once too), so the next request with this prefix finds it here."""
        self.index.insert(placement.blocks)

    def placed_by_peer(self, blocks: tuple[int, ...]) -> None:
        """Another gateway sent a request with this prompt here (gateway/cache_routing/peers.py): the engine
        computes it as it would one of ours."""
        self.index.insert(blocks)

    def dispatch(self, placement: Placement) -> int | None:
        """Its slot, once admitted (a slot is free then); None: the engine chooses."""
        placement.dispatched = time.perf_counter()
        if self.slots is None:
            return None
        picked = self.slots.pick(placement.text)
        if picked is None:
            return None
        placement.slot = picked[0]
        self.slots.take(picked[0], placement.text)
        return placement.slot

    def first_token(self, placement: Placement) -> None:
        if placement.first_token is None:
            placement.first_token = time.perf_counter()

    def report(self, placement: Placement, usage: Usage | None) -> Correction | None:
        """The engine's usage for the request (None: it said nothing): correct the index, learn the rates."""
        if placement.reported:
            return None
        placement.reported = True
        if usage is None or usage.prompt_tokens <= 0:
            return None
        self.counts.prompt_tokens += usage.prompt_tokens
        chars = len(placement.text)
        if chars:
            self.chars_per_token.update(chars / usage.prompt_tokens)
        if usage.cached_tokens is None:
            return None
        self.counts.cached_tokens += usage.cached_tokens
        uncached = usage.prompt_tokens - usage.cached_tokens
        took = usage.prefill_seconds
        if took is None and placement.first_token is not None:
            took = placement.first_token - placement.dispatched
        if took and took > 0 and uncached >= MIN_MEASURED_TOKENS:
            self.prefill_rate.update(uncached / took)
        reused_chars = usage.cached_tokens * chars / usage.prompt_tokens
        correction = self.index.correct(placement.blocks, placement.predicted, int(reused_chars // self.block_chars))
        setattr(self.counts, correction.verdict, getattr(self.counts, correction.verdict) + 1)
        return correction

    def end(self, placement: Placement) -> None:
        """The request left its slot (whatever its outcome; a second call is a no-op)."""
        if placement.done:
            return
        placement.done = True
        self.service.update(time.perf_counter() - placement.dispatched)
        if self.slots is not None and placement.slot is not None:
            self.slots.give(placement.slot)
