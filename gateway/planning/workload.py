"""The workload an operator describes, and the ten answers the selection rules read."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.planning.capacity import Fit, KvDtype

Mode = Literal["local", "production", "fleet"]
Objective = Literal["latency", "throughput", "cost", "privacy", "portability", "development"]
Heavy = Literal["prefill", "decode", "balanced"]
Interconnect = Literal["none", "pcie", "nvlink", "nvswitch", "xgmi", "unified"]
Accelerator = Literal["none", "nvidia", "amd", "apple"]
Requests = Literal["conversations", "one_shot"]


class Workload(BaseModel):
    """What the operator knows about the traffic; everything else is detected or read."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)
    prompt_tokens: int = Field(default=512, ge=1)
    """Typical prompt length."""
    output_tokens: int = Field(default=256, ge=1)
    """Typical output length."""
    context_length: int | None = Field(default=None, ge=64)
    """Target context; null takes the model's trained length, capped by what fits."""
    concurrency: int = Field(default=1, ge=1)
    """Requests in flight at once."""
    shared_prefix: bool = False
    """Requests share long prefixes (system prompts, RAG documents, agents): prefix caching pays."""
    requests: Requests = "conversations"
    """conversations (chat: each turn resends the conversation so far, so an evicted conversation recurs at
    its next turn and llama-server's host-RAM prompt cache pays) or one_shot (independent requests: without
    shared prefixes an evicted prompt never recurs, so that cache is turned off)."""
    mode: Mode = "local"
    """local (one user or team), production (a shared server) or fleet (many nodes)."""
    objective: Objective = "latency"
    """What to optimise for; throughput adds data-parallel replicas, cost uses the fewest GPUs."""
    nodes: int = Field(default=1, ge=1)
    """Hosts the model may span (more than one: multi-node engines such as Dynamo)."""
    kv_dtype: KvDtype | None = None
    """KV cache element type; null: fp16, or q8_0 / fp8 where fp16 KV limits the context or concurrency asked."""
    output_copies_prompt: bool = False
    """Outputs repeat much of the prompt (edits, rewrites, refactors, extraction): n-gram speculation pays."""
    decode_tokens_per_s: float | None = Field(default=None, gt=0)
    """Per-sequence decode rate the traffic needs; null: 10 tokens/s (a little faster than people read)."""
    priority_classes: bool = False
    """Requests carry service tiers (priority, default, flex) that the engine should schedule by, where it can
    (vLLM: `--scheduling-policy priority`, each request's tier sent as `priority`)."""


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
    moe: bool = False
    """Routed experts, whatever the family: a hybrid (Jamba, Qwen3-Next) or multimodal MoE is still MoE."""
    mode: Mode
    format: str
    interconnect: Interconnect
    objective: Objective
    nodes: int
    architecture: str
    memory_gib: float | None
    memory_figures: str = ""
    """Memory needed against usable on this host, quoted by the memory constraint when it fails."""


def heaviness(prompt_tokens: int, output_tokens: int) -> Heavy:
    """Prefill-heavy when prompts are 4x the output or more; decode-heavy when output is 2x the prompt."""
    if prompt_tokens >= 4 * output_tokens:
        return "prefill"
    if output_tokens >= 2 * prompt_tokens:
        return "decode"
    return "balanced"


def read_yaml(path: Path) -> object:
    """A YAML file's data; a syntax error becomes a ValueError naming the file, line and column."""
    try:
        return yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ValueError(f"{path}:{where}: not valid YAML ({problem})") from None


def validation_message(path: Path | str, exc: ValidationError) -> str:
    """A pydantic error as one line: the file, then each field and what is wrong with it."""
    problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'file'}: {e['msg']}" for e in exc.errors())
    return f"{path}: {problems}"


def load_workload(path: Path) -> Workload:
    data = read_yaml(path) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a workload file is a YAML mapping of Workload fields")
    try:
        return Workload.model_validate(data)
    except ValidationError as exc:
        raise ValueError(validation_message(path, exc)) from None
