"""`EngineSpec`: everything that is one engine's, declared once in that engine's module.

The planner reads the hardware facts (accelerators, formats, compute capability), the install
check and the layout -> options mapping from here; the runtime builds the adapter from here; a
server engine's launch command, readiness rule and metrics map live in its `ServerSpec`. A
third-party engine is one more `EngineSpec`, registered through the `enginegate.adapters` entry
point, and is planned and served exactly like a built-in.
"""

from __future__ import annotations

import importlib.util
import shlex
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adapters.base import Adapter, Capabilities
from adapters.config import EngineConfig

if TYPE_CHECKING:
    from adapters.engine_server import EngineServer
    from adapters.process import Endpoint, Launch

ACCELERATORS = ("none", "nvidia", "amd", "apple")


@dataclass(frozen=True, slots=True)
class Layout:
    """How the planner spreads a model: GPUs used, tensor x pipeline parallel sizes, offload."""

    gpus: int
    tensor_parallel: int
    pipeline_parallel: int
    gpu_layers: int
    """-1: every layer on the GPU(s); 0: CPU only."""
    gpu_memory_fraction: float
    context_length: int
    concurrency: int
    kv_dtype: str
    """The planner's name: fp16, bf16, fp8, q8_0, q4_0."""
    threads: int | None
    shared_prefix: bool
    data_parallel: int = 1
    """Replicas of the whole model (vLLM --data-parallel-size, SGLang --dp-size)."""


@dataclass(frozen=True, slots=True)
class Features:
    """The engine's own speed-ups the planner chose, in engine-neutral words; each engine's spec
    says which of its flags express them (`EngineSpec.feature_options`). None: the engine's default."""

    speculation: str | None = None
    """ngram (prompt lookup, no draft model), mtp (the checkpoint's own heads), or "off"; None: untouched."""
    speculative_tokens: int | None = None
    """Tokens drafted per step."""
    prefix_cache: bool | None = None
    """Reuse the KV of a prompt prefix seen before (vLLM prefix caching, SGLang's radix cache, llama.cpp cache reuse)."""
    prompt_cache_bytes: int | None = None
    """Host-RAM cache of evicted prompts (llama-server --cache-ram); 0: off."""
    batch_tokens: int | None = None
    """Prompt tokens per engine step (chunked prefill's budget: vLLM --max-num-batched-tokens, llama.cpp -b)."""
    ubatch_tokens: int | None = None
    """llama.cpp's physical batch (-ub)."""


LayoutOptions = Callable[[Layout], dict[str, Any]]
FeatureOptions = Callable[[Features], dict[str, Any]]
Missing = Callable[["EngineSpec", Mapping[str, Any]], "str | None"]


def missing_package(spec: EngineSpec, options: Mapping[str, Any]) -> str | None:
    """The default install check: every Python module importable, or one of the programs on PATH.

    `options.executable` (the engine's program replaced) or `options.python` (another interpreter)
    move the question to that program."""
    executable = options.get("executable")
    if executable:
        program = shlex.split(executable)[0] if isinstance(executable, str) else str(list(executable)[0])
        if shutil.which(program) is None and not Path(program).is_file():
            return f"options.executable names {program!r}, which is neither on PATH nor a file"
        return None
    python = options.get("python")
    if spec.python_modules and python and str(python) != sys.executable:
        return None if Path(str(python)).is_file() else f"options.python names {python!r}, which does not exist"
    if spec.python_modules and all(importlib.util.find_spec(m) is not None for m in spec.python_modules):
        return None
    if any(shutil.which(p) is not None for p in spec.programs):
        return None
    if not spec.python_modules and not spec.programs:
        return None
    what = (f"no Python module {' or '.join(repr(m) for m in spec.python_modules)}" if spec.python_modules
            else f"{' or '.join(spec.programs)} is not on PATH")
    return f"the {spec.name} engine is not installed ({what}): {spec.install_hint}"


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """An engine that is an OpenAI-compatible server of its own, launched and supervised."""

    command: Callable[[EngineServer, Endpoint], Launch] | None = None
    """Its command line for one endpoint (pure, but for writing config files into the run dir);
    None: the engine's adapter class overrides `command` (engines with state of their own)."""
    ready_path: str | None = "/health"
    """Readiness: this path answers 200; None: the engine's /v1/models lists a model."""
    metrics_path: str | None = "/metrics"
    metrics_map: Mapping[str, str] = field(default_factory=dict)
    """`EngineStats` field -> the engine's own Prometheus metric name."""
    uses_api_key: bool = True
    upstream_model: Callable[[EngineConfig], str] | None = None
    """The id sent upstream where the engine cannot be told the served name (None: the served name)."""
    startup_timeout: float = 300.0


@dataclass(frozen=True, slots=True)
class EngineSpec:
    name: str
    adapter: Callable[[EngineConfig, EngineSpec], Adapter]
    """Builds the adapter for one model (a class taking (config, spec))."""
    capabilities: Capabilities = Capabilities()
    accelerators: tuple[str, ...] = ()
    formats: tuple[str, ...] = ()
    """Model formats it loads (gguf, bf16, fp16, fp8, awq, gptq, exl2, exl3, mlx)."""
    min_compute_capability: float | None = None
    needs_fast_memory: bool = True
    """Weights and KV cache must fit in GPU (or unified) memory."""
    tensor_parallel: bool = True
    """Splits a layer's tensors across GPUs; False: several GPUs run as a pipeline of layers (llama.cpp, MLX)."""
    partial_offload: bool = False
    """Runs the layers that fit on the GPU and the rest from RAM (llama.cpp's -ngl)."""
    paged_kv: bool = True
    """Pages its KV cache; False: reserves each slot's full context up front (in-process llama.cpp, MLX)."""
    install_hint: str = ""
    python_modules: tuple[str, ...] = ()
    programs: tuple[str, ...] = ()
    missing: Missing = missing_package
    """Why the engine cannot run here (with the install hint), or None: the one install check."""
    layout_options: LayoutOptions | None = None
    """A planned layout in this engine's option names; None: not planned on its own (see plans_as)."""
    feature_options: FeatureOptions | None = None
    """The planner's `Features` in this engine's option names; None: the engine takes none of them."""
    speculation: tuple[str, ...] = ()
    """Speculation modes (`Features.speculation`) the engine can run."""
    quantized_kv: str | None = None
    """The planner's KV dtype (q8_0, fp8) this engine takes where KV bytes limit the plan; None: it keeps fp16."""
    plans_as: str | None = None
    """Planned as that engine (a mode of it), served by this adapter: llama_server plans as llamacpp."""
    defaults: Mapping[str, Any] = field(default_factory=dict)
    local_weights: bool = True
    """False: the model lives elsewhere (an external server), so nothing is resolved or planned."""
    default_concurrency: int = 1
    """Requests let through to the engine at once; servers that batch take many."""
    priority_options: Mapping[str, Any] = field(default_factory=dict)
    """Options under which the engine schedules by each request's `priority` (lower first); the planner sets
    them for a workload with priority classes, and the gateway then sends each request's tier as `priority`."""
    continues: bool = False
    """Continues a chat's final assistant message (`continue_final_message`, `add_generation_prompt: false`)
    and a completions prompt as text: the scheduler may cut one of its streams and resume it from the text
    sent (`scheduler.preempt`)."""
    traces: bool = False
    """Exports its own request spans given `options.otlp_traces_endpoint` (adapters/engine_traces.py), continuing
    the trace of the `traceparent` the gateway sends; the planner turns it on when the gateway traces."""
    container_image: str | None = None
    server: ServerSpec | None = None
    slot_field: str | None = None
    """The request field that sends a request to one of the engine's parallel slots (llama-server's
    `id_slot`); the cache-aware router sets it to the slot that holds the request's prefix."""
    slots_pay: Callable[[Mapping[str, Any]], bool] | None = None
    """Whether choosing the slot helps under these launch options (None: always, where `slot_field` is set)."""

    def create(self, config: EngineConfig) -> Adapter:
        return self.adapter(config, self)

    def why_missing(self, options: Mapping[str, Any] | None = None) -> str | None:
        return self.missing(self, options or {})

    def installed(self, options: Mapping[str, Any] | None = None) -> bool:
        return self.why_missing(options) is None
