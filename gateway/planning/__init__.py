"""Planning: which engine serves a model on this host, with which options, and why.

Minimal foundation version with one rule (no accelerator -> llama.cpp); the planning
issue replaces it with the full capacity arithmetic and selection rules.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gateway.hardware import HardwareSnapshot


class ModelSpec(BaseModel):
    model_config = ConfigDict(frozen=True)
    path: str
    format: str
    file_bytes: int | None = None


class Plan(BaseModel):
    model_config = ConfigDict(frozen=True)
    engine: str
    options: dict[str, Any] = Field(default_factory=dict)
    reasons: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    def summary(self) -> str:
        return f"{self.engine}: " + "; ".join(self.reasons)


def load_spec(path: Path) -> ModelSpec:
    fmt = "gguf" if path.suffix == ".gguf" else "unknown"
    size = path.stat().st_size if path.is_file() else None
    return ModelSpec(path=str(path), format=fmt, file_bytes=size)


def plan(snapshot: HardwareSnapshot, spec: ModelSpec, requested_engine: str = "auto") -> Plan:
    if requested_engine != "auto":
        return Plan(engine=requested_engine, reasons=(f"engine {requested_engine!r} set in the model's config",))
    if not snapshot.accelerators:
        return Plan(engine="llamacpp", reasons=("no accelerator detected: llama.cpp runs on any CPU",))
    return Plan(engine="llamacpp", reasons=("only llama.cpp is available in this build",))


__all__ = ["ModelSpec", "Plan", "load_spec", "plan"]
