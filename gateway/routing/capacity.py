"""How many requests the gateway lets through to one engine instance at once: the engine's own capacity.

From the launch (the user's options, the plan's) before the engine starts, then from the engine
itself once it serves where it says so (llama-server's /props `total_slots`):

- llama.cpp (in-process, llama-server): its slots, `parallel` (`-np`); llama-server's own count
  when it was left to choose.
- vLLM: `max_num_seqs` (`--max-num-seqs`); SGLang: `max_running_requests` (`--max-running-requests`),
  given as an option or in `extra_args`; else the plan's `max_concurrency`, else the engine's default.
- An external URL (`engine: openai`): no gateway cap (None) unless `max_concurrency` is set;
  the upstream queues on its own and its 429/503 answers reach the breaker.
- `max_concurrency`, set by the user, always wins.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from adapters.base import Adapter

ENGINE_LIMITS: Mapping[str, tuple[str, tuple[str, ...]]] = {
    "llamacpp": ("parallel", ("-np", "--parallel")),
    "llama_server": ("parallel", ("-np", "--parallel")),
    "vllm": ("max_num_seqs", ("--max-num-seqs",)),
    "sglang": ("max_running_requests", ("--max-running-requests",)),
}
"""Engine -> (its option, its command-line flags) for the requests it runs at once."""
UNCAPPED = frozenset({"openai", "external"})


def _from_args(args: Any, flags: Sequence[str]) -> int | None:
    if isinstance(args, str):
        args = args.split()
    if not isinstance(args, (list, tuple)):
        return None
    items = [str(a) for a in args]
    for i, item in enumerate(items):
        for flag in flags:
            if item == flag and i + 1 < len(items) and items[i + 1].isdigit():
                return int(items[i + 1])
            if item.startswith(flag + "=") and item.split("=", 1)[1].isdigit():
                return int(item.split("=", 1)[1])
    return None


def engine_limit(engine: str, options: Mapping[str, Any]) -> int | None:
    """The engine's own limit as launched (its option or its flag in extra_args); None when left to the engine."""
    known = ENGINE_LIMITS.get(engine)
    if known is None:
        return None
    option, flags = known
    if options.get(option):
        return int(options[option])
    return _from_args(options.get("extra_args"), flags)


def configured(engine: str, options: Mapping[str, Any], default: int, user: Mapping[str, Any] | None = None) -> int | None:
    """The gateway's cap before the engine started; None: no cap.

    `user` is what the user set explicitly (their `max_concurrency` beats the engine's limit;
    the plan's does not)."""
    if user and user.get("max_concurrency"):
        return int(user["max_concurrency"])
    limit = engine_limit(engine, options)
    if limit is not None:
        return limit
    if engine in UNCAPPED:
        return None
    return max(int(options.get("max_concurrency") or 0), default)


async def reported(adapter: Adapter) -> int | None:
    """The capacity the running engine reports (llama-server's slots); None when it says nothing."""
    if adapter.engine != "llama_server":
        return None
    props = getattr(adapter, "props", None)
    if props is None:
        return None
    try:
        raw = await props()
        total = orjson.loads(raw).get("total_slots") if raw else None
    except (orjson.JSONDecodeError, AttributeError, OSError, TimeoutError):
        return None
    return int(total) if isinstance(total, int) and total > 0 else None
