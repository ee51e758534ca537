"""LoRA adapters as models: the engine's selection per request, its launch flags, the config and the plan."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from adapters.lora import LoraAdapter, llama_server_args, llama_server_selection, lora_adapters
from adapters.llama_server import launch_args
from adapters.process import Endpoint
from gateway.config import LoraConfig, ModelConfig
from gateway.lora.plan import adapter_bytes, engine_for_adapters, with_adapters

A = LoraAdapter("tone-a", "/w/a.gguf", 1.0)
B = LoraAdapter("tone-b", "/w/b.gguf", 0.5)
A_OFF = LoraAdapter("tone-a-off", "/w/a.gguf", 0.0)
ALL = (A, B, A_OFF)


@pytest.mark.parametrize(("model", "selection"), [
    ("base", [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}]),  # the base: every adapter explicitly off
    ("tone-a", [{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.0}]),
    ("tone-b", [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.5}]),
    ("tone-a-off", [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}]),  # one file, two names, two scales
])
def test_llama_server_gets_every_adapters_scale_on_every_request(model: str, selection: list[dict[str, float]]) -> None:
    assert llama_server_selection(ALL, model) == selection


def test_no_adapters_no_lora_field_and_no_flags() -> None:
    assert llama_server_selection((), "base") is None and llama_server_args(()) == []


def test_llama_server_loads_each_file_once_without_applying_it() -> None:
    assert llama_server_args(ALL) == ["--lora", "/w/a.gguf,/w/b.gguf", "--lora-init-without-apply"]
    options = {"lora_adapters": [{"name": a.name, "path": a.path, "scale": a.scale} for a in ALL]}
    argv = launch_args(Path("/bin/llama-server"), Path("/w/base.gguf"), "base", options, Endpoint("127.0.0.1", 1, ""))
    assert argv[argv.index("--lora") + 1] == "/w/a.gguf,/w/b.gguf"
    embedder = launch_args(Path("/bin/llama-server"), Path("/w/base.gguf"), "base", options, Endpoint("127.0.0.1", 1, ""),
                           embeddings=True)
    assert "--lora" not in embedder  # the embedding process serves the base only


@pytest.mark.parametrize("raw", [[{"name": "x"}], [{"path": "/a"}], "a.gguf", [["x", "/a"]]])
def test_engine_options_that_are_not_adapters_are_refused(raw: object) -> None:
    with pytest.raises(ValueError, match="lora_adapters"):
        lora_adapters({"lora_adapters": raw})


def test_an_adapter_is_in_exactly_one_place_and_named_once() -> None:
    with pytest.raises(ValidationError, match="exactly one of path and source"):
        LoraConfig(name="x")
    with pytest.raises(ValidationError, match="exactly one of path and source"):
        LoraConfig(name="x", path="/a", source="org/repo/a.gguf")
    with pytest.raises(ValidationError, match="tone-a given twice"):
        ModelConfig(adapters=[{"name": "tone-a", "path": "/a"}, {"name": "tone-a", "path": "/b"}])
    with pytest.raises(ValidationError, match="name"):
        LoraConfig(name="bad name/../x", path="/a")
    with pytest.raises(ValidationError, match="scale"):
        LoraConfig(name="x", path="/a", scale=-1)


def test_the_plan_charges_the_adapters_bytes_where_the_weights_are(tmp_path: Path) -> None:
    (tmp_path / "a.gguf").write_bytes(b"x" * 1000)
    peft = tmp_path / "peft"
    peft.mkdir()
    (peft / "adapter_model.safetensors").write_bytes(b"x" * 300)
    (peft / "adapter_config.json").write_bytes(b"{}")
    assert adapter_bytes([str(tmp_path / "a.gguf"), str(tmp_path / "a.gguf"), str(peft)]) == 1302  # each file once
    assert with_adapters({"gpu:0": 10, "gpu:1": 10}, 5) == {"gpu:0": 15, "gpu:1": 10}
    assert with_adapters({}, 5) == {"ram": 5} and with_adapters({"ram": 1}, 0) == {"ram": 1}


def test_the_in_process_engine_is_replaced_by_llama_server_for_adapters() -> None:
    assert engine_for_adapters("llamacpp") == "llama_server"
    assert engine_for_adapters("vllm") is None and engine_for_adapters("llama_server") is None


def test_vllm_registers_every_adapter_by_name_within_its_gpu_slots(tmp_path: Path) -> None:
    from adapters.lora import sglang_args, vllm_args  # noqa: PLC0415

    peft = tmp_path / "peft"
    peft.mkdir()
    (peft / "adapter_config.json").write_text('{"r": 12}')
    many = tuple(LoraAdapter(f"t{i}", str(peft)) for i in range(10))  # ten fine-tunes on one base
    argv = vllm_args(many, {})
    assert argv[:2] == ["--enable-lora", "--lora-modules"] and f"t9={peft}" in argv
    # 4 GPU slots (vLLM evicts the least recently used), every adapter in its CPU cache, rank 12 -> 16
    assert argv[-6:] == ["--max-loras", "4", "--max-lora-rank", "16", "--max-cpu-loras", "10"]
    assert vllm_args(many, {"max_loras": 2, "max_lora_rank": 64})[-6:] == [
        "--max-loras", "2", "--max-lora-rank", "64", "--max-cpu-loras", "10"]  # the user's options win
    assert sglang_args(many[:2], {})[-6:] == ["--max-loras-per-batch", "2", "--max-lora-rank", "16",
                                               "--lora-eviction-policy", "lru"]
    with pytest.raises(ValueError, match="no per-request scale"):
        vllm_args((LoraAdapter("half", str(peft), 0.5),), {})


def test_server_engines_select_the_adapter_their_own_way() -> None:
    from adapters import registry  # noqa: PLC0415
    from adapters.base import RequestContext  # noqa: PLC0415
    from adapters.config import EngineConfig  # noqa: PLC0415

    options = {"lora_adapters": [{"name": "tone-a", "path": "/w/a"}]}
    body = {"model": "tone-a", "messages": []}

    def make(engine: str):  # type: ignore[no-untyped-def]
        return registry.spec(engine).create(EngineConfig(source="/w/base", name="base", options=options))

    ctx = RequestContext(request_id="r", model="tone-a")
    assert make("vllm").select_lora({**body, "model": "alias"}, ctx)["model"] == "tone-a"
    assert make("sglang").select_lora(body, ctx) == {"model": "base", "messages": [], "lora_path": "tone-a"}
    assert make("llama_server").select_lora(body, ctx)["lora"] == [{"id": 0, "scale": 1.0}]
    base = RequestContext(request_id="r", model="base")
    assert make("vllm").select_lora({"model": "base"}, base) == {"model": "base"}
    assert make("llama_server").select_lora({"model": "base"}, base)["lora"] == [{"id": 0, "scale": 0.0}]


def test_runtime_loading_registers_nothing_at_start_and_sizes_the_engines_places(tmp_path: Path) -> None:
    from adapters.lora import lora_flags, runtime_capacity, sglang_args, vllm_args

    peft = tmp_path / "peft"
    peft.mkdir()
    (peft / "adapter_config.json").write_text('{"r": 8, "target_modules": ["q_proj", "v_proj"]}')
    three = tuple(LoraAdapter(n, str(peft)) for n in ("a", "b", "c"))
    runtime = {"lora_loading": "runtime", "max_loras": 2}
    assert vllm_args(three, runtime) == ["--enable-lora", "--max-loras", "2", "--max-lora-rank", "8",
                                         "--max-cpu-loras", "2"]
    assert runtime_capacity(three, {**runtime, "max_loaded_loras": 3}) == 3
    assert runtime_capacity(three, {**runtime, "max_loaded_loras": 1}) == 2  # never below the GPU slots
    assert sglang_args(three, runtime) == [
        "--enable-lora", "--max-loras-per-batch", "2", "--max-lora-rank", "8", "--max-loaded-loras", "2",
        "--lora-target-modules", "q_proj", "v_proj", "--lora-eviction-policy", "lru"]
    assert lora_flags(three, runtime) == {"slots": 2, "max_rank": 8, "loading": "runtime", "loaded_at_once": 2}
    assert lora_flags(three, {}) == {"slots": 3, "max_rank": 8, "loading": "start", "loaded_at_once": 3}
    assert lora_flags((), runtime) == {}
    with pytest.raises(ValueError, match="lora_loading 'lazy'"):
        vllm_args(three, {"lora_loading": "lazy"})


def test_llama_server_refuses_runtime_loading_it_has_no_endpoint_for() -> None:
    from adapters.base import EngineError

    options = {"lora_adapters": [{"name": "tone-a", "path": "/w/a.gguf"}], "lora_loading": "runtime"}
    with pytest.raises(EngineError, match="llama-server loads every LoRA adapter at start"):
        launch_args(Path("/bin/llama-server"), Path("/m.gguf"), "base", options, Endpoint("127.0.0.1", 1, ""))
