"""What a plan says about a model's LoRA adapters (`Plan.lora`, `enginegate plan`): a record, no logic."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class PlannedAdapter(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    path: str
    scale: float = 1.0
    bytes: int = 0


class LoraPlan(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    adapters: tuple[PlannedAdapter, ...]
    engine_flags: tuple[str, ...]
    """The engine's LoRA launch flags as the adapter will pass them."""
    loading: str
    """`start` (every adapter registered when the engine starts) or `runtime` (loaded by the gateway on first use)."""
    loaded_at_once: int
    """Adapters the engine holds loaded at once (runtime: `max_loaded_loras`; start: all of them)."""
    slots: int | None = None
    """Adapters in one batch (vLLM --max-loras, SGLang --max-loras-per-batch); None: llama-server, every one."""
    max_rank: int | None = None
    """The rank the engine sizes its LoRA buffers for (vLLM/SGLang --max-lora-rank)."""
    file_bytes: int = 0
    """The adapters' files, each once: charged to the model's memory beside its weights."""
    note: str | None = None
    """Where the engine cannot serve the adapters as planned, why."""
    slot_bytes: int | None = None
    """The GPU buffers the slots reserve (slots x max rank x the attention projections' widths, 16-bit): a lower
    bound, since MLP projections, where the engine adapts them, add more. None where not sized."""
