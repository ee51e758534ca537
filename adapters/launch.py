"""The unified launch options every server engine understands, read once from the merged options.

Each engine module turns a `LaunchOptions` into its own flags with a pure function (table-tested
without the engine). Option names (a model's `options` in the config, or the plan's; the config's
value wins, see adapters/config.py):

    tensor_parallel, pipeline_parallel     sizes (1 = off)
    data_parallel                          replicas of the whole model (vLLM, SGLang; 1 = off)
    nodes, node_rank, master_addr, hosts   multi-node: how many machines, this one's rank, the
                                           head's address (host:port), and all hosts (mpirun)
    context_length                         tokens of context
    gpu_memory_fraction                    share of GPU memory the engine may take (0..1]
    quantization, kv_cache_dtype           the engine's own names (fp8, awq, ...; auto/fp8/...)
    metrics                                expose the engine's Prometheus metrics (default true)
    executable                             replaces the engine's program (a venv's python -m ...,
                                           a wrapper); a string or a list of strings
    python                                 the interpreter for `python -m` engines (default: ours)
    env                                    extra environment for the engine process
    extra_args                             appended to the engine's command line as given
    speculative_config                     speculative decoding in vLLM's shape ({"method": "ngram"|"mtp"|
                                           "draft_model"|"eagle3", "num_speculative_tokens", "model", ...});
                                           SGLang and TensorRT-LLM get their own spelling of it
    prefix_caching                         reuse cached prompt prefixes (true/false; unset: engine default)
    max_batched_tokens                     tokens per engine step, the chunked-prefill budget
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from adapters.spec import Features, Layout


class LaunchConfigError(ValueError):
    """An option has a value the engine cannot take; the message names the option."""


@dataclass(frozen=True, slots=True)
class LaunchOptions:
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    data_parallel: int = 1
    nodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    hosts: tuple[str, ...] = ()
    context_length: int | None = None
    gpu_memory_fraction: float | None = None
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    metrics: bool = True
    executable: tuple[str, ...] | None = None
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    speculative_config: Mapping[str, Any] | None = None
    prefix_caching: bool | None = None
    max_batched_tokens: int | None = None

    @property
    def world_size(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel

    def program(self, default: Sequence[str]) -> list[str]:
        """The engine's program: `executable` if configured, else `default`."""
        return list(self.executable) if self.executable else list(default)

    def python_module(self, module: str) -> list[str]:
        return self.program([self.python, "-m", module])


def _positive_int(options: Mapping[str, Any], key: str, default: int) -> int:
    value = options.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LaunchConfigError(f"options.{key} must be a positive integer, got {value!r}")
    return value


def strings(options: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = options.get(key)
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(shlex.split(value))
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise LaunchConfigError(f"options.{key} must be a string or a list of strings, got {value!r}")


def launch_options(options: Mapping[str, Any]) -> LaunchOptions:
    fraction = options.get("gpu_memory_fraction")
    if fraction is not None:
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
            raise LaunchConfigError(f"options.gpu_memory_fraction must be in (0, 1], got {fraction!r}")
        fraction = float(fraction)
    context = options.get("context_length")
    if context is not None:
        context = _positive_int(options, "context_length", 1)
    env = options.get("env") or {}
    if not isinstance(env, Mapping):
        raise LaunchConfigError("options.env must be a mapping of variable names to values")
    nodes = _positive_int(options, "nodes", 1)
    rank = options.get("node_rank", 0)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < nodes:
        raise LaunchConfigError(f"options.node_rank must be in [0, {nodes}), got {rank!r}")
    master = options.get("master_addr")
    if nodes > 1 and not master:
        raise LaunchConfigError("options.master_addr (host:port of node 0) is required when options.nodes > 1")
    executable = strings(options, "executable") or None
    speculative = options.get("speculative_config")
    if isinstance(speculative, str):
        try:
            speculative = json.loads(speculative)
        except ValueError:
            speculative = None
    if speculative is not None and (not isinstance(speculative, Mapping) or not speculative.get("method") and
                                    not speculative.get("model")):
        raise LaunchConfigError("options.speculative_config must be a mapping (or JSON) with a method or a model, "
                                f"got {options.get('speculative_config')!r}")
    prefix = options.get("prefix_caching")
    if prefix is not None and not isinstance(prefix, bool):
        raise LaunchConfigError(f"options.prefix_caching must be true or false, got {prefix!r}")
    return LaunchOptions(
        tensor_parallel=_positive_int(options, "tensor_parallel", 1),
        pipeline_parallel=_positive_int(options, "pipeline_parallel", 1),
        data_parallel=_positive_int(options, "data_parallel", 1),
        nodes=nodes,
        node_rank=rank,
        master_addr=str(master) if master else None,
        hosts=strings(options, "hosts"),
        context_length=context,
        gpu_memory_fraction=fraction,
        quantization=str(options["quantization"]) if options.get("quantization") else None,
        kv_cache_dtype=str(options["kv_cache_dtype"]) if options.get("kv_cache_dtype") else None,
        metrics=bool(options.get("metrics", True)),
        executable=executable,
        python=str(options.get("python") or sys.executable),
        env={str(k): str(v) for k, v in env.items()},
        extra_args=strings(options, "extra_args"),
        speculative_config=dict(speculative) if speculative else None,
        prefix_caching=prefix,
        max_batched_tokens=_positive_int(options, "max_batched_tokens", 0) or None,
    )


def flag(argv: list[str], name: str, value: object | None) -> None:
    """Append `name value` when value is set (not None)."""
    if value is not None:
        argv += [name, str(value)]


def flag_if_not_default(argv: list[str], name: str, value: int, default: int = 1) -> None:
    if value != default:
        argv += [name, str(value)]


SERVER_KV_DTYPE = {"fp16": "auto", "bf16": "auto", "fp8": "fp8", "q8_0": "fp8", "q4_0": "fp8"}
"""The planner's KV dtype in vLLM's, SGLang's and Dynamo's `--kv-cache-dtype` names."""


def server_layout_options(lay: Layout, kv_dtypes: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A planned layout in the options above (the ones every server engine reads); `kv_dtypes` maps the
    planner's KV dtype to the engine's `kv_cache_dtype` (None: the engine takes no KV dtype option)."""
    options: dict[str, Any] = {
        "context_length": lay.context_length,
        "tensor_parallel": lay.tensor_parallel,
        "pipeline_parallel": lay.pipeline_parallel,
        "gpu_memory_fraction": lay.gpu_memory_fraction,
        "max_concurrency": lay.concurrency,
    }
    if lay.data_parallel > 1:
        options["data_parallel"] = lay.data_parallel
    if kv_dtypes is not None:
        options["kv_cache_dtype"] = kv_dtypes[lay.kv_dtype]
    return options


def kv_layout_options(lay: Layout) -> dict[str, Any]:
    """vLLM's and SGLang's: the server options with `--kv-cache-dtype` in their names."""
    return server_layout_options(lay, SERVER_KV_DTYPE)


NGRAM_LOOKUP = {"prompt_lookup_max": 4, "prompt_lookup_min": 2}
"""n-gram (prompt lookup) drafting: match the last 2-4 tokens against the prompt."""


def server_feature_options(f: Features) -> dict[str, Any]:
    """The planner's features in the server engines' option names (each engine spells the flags)."""
    options: dict[str, Any] = {}
    if f.speculation in ("ngram", "mtp"):
        config: dict[str, Any] = {"method": f.speculation, "num_speculative_tokens": f.speculative_tokens or 1}
        if f.speculation == "ngram":
            config.update(NGRAM_LOOKUP)
        options["speculative_config"] = config
    if f.prefix_cache is not None:
        options["prefix_caching"] = f.prefix_cache
    if f.batch_tokens is not None:
        options["max_batched_tokens"] = f.batch_tokens
    return options
