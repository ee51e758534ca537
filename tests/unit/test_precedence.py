"""Engine defaults < plan < the user's explicit settings: what the user sets is what the engine gets.

Each row plans a model on a recorded host, applies a model config the way `Runtime.build` does
(`planning.apply_user`, `runtime.engine_config`), builds the engine's real adapter through the
registry and reads the command line (or config) it would launch. No engine runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from adapters import registry
from adapters.config import Override, resolve_options
from adapters.dynamo import DynamoAdapter
from adapters.engine_server import EngineServer
from adapters.llamacpp import LlamaCppAdapter
from adapters.mlx import MLXAdapter
from adapters.process import Endpoint
from adapters.server import ServerAdapter
from gateway.config import ModelConfig
from gateway.planning import ENGINES, ModelSpec, Plan, apply_user, installed_set, load_spec, plan
from gateway.runtime import engine_config, user_settings
from tests.unit.hosts import MODELS, embedded_gguf, host

EP = Endpoint("127.0.0.1", 9000, "KEY")
ALL = installed_set(set(ENGINES) | {"llama_server", "mlx_server"})


def test_resolve_options_orders_defaults_plan_user() -> None:
    resolved = resolve_options({"a": 1, "b": 1, "c": 1}, {"b": 2, "c": 2}, {"c": 3, "d": None})
    assert resolved.options == {"a": 1, "b": 2, "c": 3}
    assert resolved.overridden == (Override("c", 2, 3),)
    assert resolve_options({}, {"x": 1}, {"x": 1}).overridden == ()  # the same value is no override


def test_only_explicit_top_level_fields_count_as_the_users() -> None:
    assert user_settings(ModelConfig()) == {}
    assert user_settings(ModelConfig(gpu_layers=0, options={"parallel": 4})) == {"gpu_layers": 0, "parallel": 4}
    # a key in options wins over the same top-level field
    assert user_settings(ModelConfig(context_length=1024, options={"context_length": 2048})) == {"context_length": 2048}


@dataclass
class Row:
    id: str
    engine: str
    host: str
    model: str
    fields: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    expect: tuple[str, ...] = ()
    """Consecutive argv items that must appear (the user's flag and value)."""
    also: tuple[str, ...] = ()
    overridden: tuple[str, ...] = ()


ROWS = [
    Row("llama_server-parallel", "llama_server", "build-machine", "smollm2", options={"parallel": 4},
        expect=("-np", "4"), overridden=("parallel",)),
    Row("llama_server-fields", "llama_server", "build-machine", "smollm2", fields={"context_length": 1024, "threads": 2},
        expect=("-c", "1024", "-t", "2"), overridden=("context_length", "threads")),
    Row("llama_server-kv", "llama_server", "build-machine", "smollm2", options={"kv_cache_type": "q8_0"},
        expect=("-ctk", "q8_0", "-ctv", "q8_0"), overridden=("kv_cache_type",)),
    Row("vllm-memory", "vllm", "build-machine", "llama-3-8b", options={"gpu_memory_fraction": 0.05},
        expect=("--gpu-memory-utilization", "0.05"), overridden=("gpu_memory_fraction",)),
    Row("vllm-kv-context", "vllm", "4x-a100-nvlink", "llama-3-8b",
        options={"kv_cache_dtype": "fp8", "context_length": 2048},
        expect=("--max-model-len", "2048"), also=("--kv-cache-dtype", "fp8"),
        overridden=("context_length", "kv_cache_dtype")),
    Row("vllm-top-level-context", "vllm", "4x-a100-nvlink", "llama-3-8b", fields={"context_length": 4096},
        expect=("--max-model-len", "4096"), overridden=("context_length",)),
    Row("sglang", "sglang", "4x-a100-nvlink", "llama-3-8b", options={"gpu_memory_fraction": 0.5, "context_length": 1024},
        expect=("--context-length", "1024", "--mem-fraction-static", "0.5"),
        overridden=("context_length", "gpu_memory_fraction")),
    Row("tensorrt_llm", "tensorrt_llm", "4x-a100-nvlink", "llama-3-8b", options={"context_length": 1024},
        expect=("--max_seq_len", "1024"), overridden=("context_length",)),
    Row("dynamo-mocker", "dynamo", "4x-a100-nvlink", "llama-3-8b", options={"worker": "mocker"},
        overridden=("worker",)),
    Row("dynamo-router", "dynamo", "4x-a100-nvlink", "llama-3-8b", options={"router_mode": "kv"},
        expect=("--router-mode", "kv"), overridden=("router_mode",)),
    Row("exllamav3", "exllamav3", "4x-a100-nvlink", "llama-3-8b-exl3", options={"kv_cache_dtype": "q4"},
        overridden=("kv_cache_dtype",)),
]


def _model_path(name: str) -> str:
    return str(embedded_gguf()) if name == "smollm2" else str(MODELS / name)


def _spec(name: str) -> ModelSpec:
    return load_spec(Path(_model_path(name)))


def _build(row: Row, tmp_path: Path) -> tuple[Plan, Any]:
    snapshot = host(row.host)
    planned = plan(snapshot, _spec(row.model), requested_engine=row.engine, installed=ALL)
    options = dict(row.options)
    if row.engine == "llama_server":
        binary = tmp_path / "llama-server"
        binary.write_text("")
        options["binary"] = str(binary)
    if row.engine == "exllamav3":
        options["tabby_dir"] = str(tmp_path)
    config = ModelConfig(source=_model_path(row.model), name="m", engine=row.engine, options=options, **row.fields)
    final = apply_user(planned, user_settings(config), snapshot)
    spec = registry.spec(final.engine)
    adapter = spec.create(engine_config(config, spec, final.options))
    return final, adapter


def _contains(argv: list[str], seq: tuple[str, ...]) -> bool:
    return any(argv[i:i + len(seq)] == list(seq) for i in range(len(argv)))


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_what_the_user_sets_is_what_the_engine_gets(row: Row, tmp_path: Path) -> None:
    final, adapter = _build(row, tmp_path)
    assert adapter.engine == row.engine
    assert {o.option for o in final.overridden} == set(row.overridden)
    for o in final.overridden:
        assert final.options[o.option] == o.chosen != o.planned
    assert isinstance(adapter, ServerAdapter)
    argv = adapter.launch(EP).argv
    assert _contains(argv, row.expect) and _contains(argv, row.also), argv
    if isinstance(adapter, DynamoAdapter):
        worker = adapter.launch_worker(EP).argv
        assert ("dynamo.mocker" in worker) == (row.options.get("worker") == "mocker")
    if row.engine == "exllamav3":
        config = yaml.safe_load((Path(adapter.launch(EP).cwd or "") / "config.yml").read_text())
        assert config["model"]["cache_mode"] == "Q4"
    if isinstance(adapter, EngineServer) and row.engine == "exllamav3":
        (tmp_path / "main.py").write_text("")
        adapter.check()  # installed (a checkout) and the A100's compute capability suffices


def test_in_process_llamacpp_takes_the_users_fields(tmp_path: Path) -> None:
    row = Row("llamacpp", "llamacpp", "rtx-3060", "smollm2", fields={"gpu_layers": 0, "threads": 3, "context_length": 512})
    final, adapter = _build(row, tmp_path)
    assert isinstance(adapter, LlamaCppAdapter)
    assert (adapter.n_gpu_layers, adapter.n_threads, adapter.n_ctx) == (0, 3, 512)
    assert {o.option for o in final.overridden} >= {"gpu_layers", "context_length"}  # the plan chose -1 and 8192


def test_in_process_mlx_takes_the_users_context(tmp_path: Path) -> None:
    row = Row("mlx", "mlx", "macbook-air-m2", "llama-3-70b-mlx-4bit", options={"context_length": 777})
    final, adapter = _build(row, tmp_path)
    assert isinstance(adapter, MLXAdapter) and adapter.context_length == 777
    assert [o.option for o in final.overridden] == ["context_length"]


def test_an_override_the_hardware_cannot_hold_is_warned_about_and_still_used(tmp_path: Path) -> None:
    row = Row("vllm-tp4", "vllm", "2x-rtx-4090", "llama-3-8b", options={"tensor_parallel": 4})
    final, adapter = _build(row, tmp_path)
    assert any("tensor_parallel 4" in w and "2 GPU(s)" in w for w in final.warnings), final.warnings
    assert _contains(adapter.launch(EP).argv, ("--tensor-parallel-size", "4"))
    assert any("user override: tensor_parallel=4" in r for r in final.reasons)


def test_no_warning_when_the_user_asks_for_what_the_host_has(tmp_path: Path) -> None:
    row = Row("vllm-tp2", "vllm", "2x-rtx-4090", "llama-3-8b", options={"tensor_parallel": 2})
    final, _ = _build(row, tmp_path)
    assert not any("tensor_parallel" in w for w in final.warnings)
