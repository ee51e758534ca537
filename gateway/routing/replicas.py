"""The replicas behind one model name: `replicas: N` of its own engine, then each of its `backends:`.

`instances()` is pure (table-tested): which engine instances to run and each one's options.
Local replicas of one engine split the host's threads between them (each gets
threads // N, at least 1) unless the user set `threads`, which each replica then takes as
given; each has its own process, port, slots and log (`instance` names it). With more than one
replica, an engine that dies under a request fails that request at once (`wait_for_restart`
off), so the gateway retries it on another replica instead of waiting for this one's restart.
`build()` turns instances into `Replica`s with an admission sized from the engine's capacity.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from adapters.base import Adapter
from gateway.config import ModelConfig, SchedulerConfig
from gateway.routing import capacity
from gateway.routing.admission import Admission
from gateway.routing.health import Breaker
from gateway.routing.pool import Replica

THREADED = frozenset({"llamacpp", "llama_server"})
"""Engines whose `threads` option sets their CPU threads (so replicas on one host share the cores)."""


@dataclass(frozen=True, slots=True)
class Instance:
    engine: str
    options: dict[str, Any]
    """This instance's own options: the model's (or its backend entry's) with its share of threads."""
    user: dict[str, Any] = field(default_factory=dict)
    """What the user set explicitly for it (their `max_concurrency` beats the engine's capacity)."""
    local: bool = True
    """Its engine runs the model's weights here (False: an external URL)."""


SPLIT_MEMORY = ("cache_ram_mib",)
"""Host-RAM sizes the plan made for one engine (llama-server's prompt cache), shared out among its local
replicas as the threads are, so N replicas hold what the plan budgeted for one; a user's size is each one's."""


def _split_threads(options: dict[str, Any], user: Mapping[str, Any], engine: str, count: int, cpus: int) -> dict[str, Any]:
    if count <= 1 or engine not in THREADED:
        return options
    split = {k: max(1, int(options[k]) // count) for k in SPLIT_MEMORY if options.get(k) and not user.get(k)}
    if not user.get("threads"):
        split["threads"] = max(1, int(options.get("threads") or cpus) // count)
    return {**options, **split}


def instances(config: ModelConfig, engine: str, options: Mapping[str, Any], user: Mapping[str, Any],
              backends: list[tuple[str, dict[str, Any], dict[str, Any], bool]], cpus: int | None = None) -> list[Instance]:
    """The model's engine `config.replicas` times, then each backend entry (engine, options, user, local)
    its own `replicas` times (`backends` has one tuple per instance already)."""
    cpus = cpus or os.cpu_count() or 1
    local_count = config.replicas + sum(1 for b in backends if b[3] and b[0] == engine)
    own = _split_threads(dict(options), user, engine, local_count, cpus)
    found = [Instance(engine, dict(own), dict(user)) for _ in range(config.replicas)]
    for b_engine, b_options, b_user, local in backends:
        b_opts = _split_threads(dict(b_options), b_user, b_engine, local_count if b_engine == engine else 1, cpus)
        found.append(Instance(b_engine, b_opts, dict(b_user), local))
    if len(found) > 1:
        found = [Instance(i.engine, {**i.options, "instance": f"r{n}", "wait_for_restart": False}, i.user, i.local)
                 for n, i in enumerate(found)]
    return found


def admission_for(instance: Instance, default_concurrency: int, max_queue: int,
                  policy: SchedulerConfig | None = None, continues: bool = False) -> tuple[Admission, str]:
    """The instance's admission and where its slot count came from; `continues`: the engine can resume a
    cut stream from its text (preemption's default)."""
    slots = capacity.configured(instance.engine, instance.options, default_concurrency, instance.user)
    if instance.user.get("max_concurrency"):
        source = "user"
    elif capacity.engine_limit(instance.engine, instance.options) is not None:
        source = "launch"
    elif slots is None:
        source = "none"
    else:
        source = "engine default"
    preempt = policy.preempt if policy is not None else None
    return Admission(slots, max_queue, policy, preempts=continues if preempt is None else preempt), source


def build(found: list[Instance], create: Callable[[Instance], Adapter], config: ModelConfig) -> list[Replica]:
    routing = config.routing
    replicas: list[Replica] = []
    for n, instance in enumerate(found):
        adapter = create(instance)
        admission, source = admission_for(instance, adapter.default_concurrency, config.max_queue, config.scheduler,
                                          adapter.continues)
        replicas.append(Replica(adapter, admission, name=str(n), capacity_from=source,
                                breaker=Breaker(routing.failure_threshold, routing.open_seconds)))
    return replicas
