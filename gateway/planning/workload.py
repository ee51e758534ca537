"""The workload an operator describes, and the ten answers the selection rules read."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from gateway.planning.capacity import Fit, KvDtype

Mode = Literal["local", "production", "fleet"]
Objective = Literal["latency", "throughput", "cost", "privacy", "portability", "development"]
Heavy = Literal["prefill", "decode", "balanced"]
Interconnect = Literal["none", "pcie", "nvlink", "nvswitch", "xgmi", "unified"]
Accelerator = Literal["none", "nvidia", "amd", "apple"]


class Workload(BaseModel):
    """What the operator knows about the traffic; everything else is detected or read."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    prompt_tokens: int = Field(default=512, ge=1)
    """Typical prompt length."""
    output_tokens: int = Field(default=256, ge=1)
    context_length: int | None = Field(default=None, ge=64)
    """Target context; null takes the model's trained length, capped by what fits."""
    concurrency: int = Field(default=1, ge=1)
    shared_prefix: bool = False
    """Requests share long prefixes (system prompts, RAG documents, agents): prefix caching pays."""
    mode: Mode = "local"
    objective: Objective = "latency"
    nodes: int = Field(default=1, ge=1)
    kv_dtype: KvDtype = "fp16"


class Profile(BaseModel):
    """The ten questions, answered: the facts the selection rules match on."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    accelerator: Accelerator
    gpus: int
    consumer_gpu: bool
    min_compute_capability: float | None
    fit: Fit
    heavy: Heavy
    context_length: int
    concurrency: int
    shared_prefix: bool
    family: str
    mode: Mode
    format: str
    interconnect: Interconnect
    objective: Objective
    nodes: int
    architecture: str
    memory_gib: float | None


def heaviness(prompt_tokens: int, output_tokens: int) -> Heavy:
    """Prefill-heavy when prompts are 4x the output or more; decode-heavy when output is 2x the prompt."""
    if prompt_tokens >= 4 * output_tokens:
        return "prefill"
    if output_tokens >= 2 * prompt_tokens:
        return "decode"
    return "balanced"


def load_workload(path: Path) -> Workload:
    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a workload file is a YAML mapping of Workload fields")
    return Workload.model_validate(data)
