from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from adapters import registry
from adapters.base import EngineError
from adapters.llama_server import LlamaServerAdapter, find_llama_server, launch_args, launch_env, model_file
from adapters.process import Endpoint
from gateway.commands import engines
from adapters.config import EngineConfig

ENDPOINT = Endpoint("127.0.0.1", 40123, "secret-key")


def test_launch_args_map_plan_and_config_options() -> None:
    argv = launch_args(Path("/bin/llama-server"), Path("/m.gguf"), "served", {
        "context_length": 4096, "threads": 2, "gpu_layers": 99, "parallel": 4, "kv_cache_type": "q8_0",
        "split_mode": "layer", "tensor_split": [3, 1], "extra_args": ["--flash-attn", "on"],
    }, ENDPOINT)
    assert argv[:3] == ["/bin/llama-server", "-m", "/m.gguf"]
    pairs = dict(zip(argv[3::1], argv[4::1]))
    assert pairs["--port"] == "40123" and pairs["--host"] == "127.0.0.1" and pairs["-a"] == "served"
    assert pairs["-c"] == "4096" and pairs["-t"] == "2" and pairs["-ngl"] == "99" and pairs["-np"] == "4"
    assert pairs["-ctk"] == "q8_0" and pairs["-ctv"] == "q8_0" and pairs["-sm"] == "layer" and pairs["-ts"] == "3,1"
    assert "--metrics" in argv and argv[-2:] == ["--flash-attn", "on"]
    assert "secret-key" not in argv, "argv is world-readable: the key goes through the environment"
    assert launch_env(ENDPOINT) == {"LLAMA_API_KEY": "secret-key"}


def test_embedding_instance_and_bad_options() -> None:
    argv = launch_args(Path("/b"), Path("/m"), "s", {"parallel": 4}, ENDPOINT, embeddings=True)
    assert "--embeddings" in argv and "-np" not in argv and argv[argv.index("--pooling") + 1] == "mean"
    with pytest.raises(EngineError, match="unknown kv_cache_type"):
        launch_args(Path("/b"), Path("/m"), "s", {"kv_cache_type": "q3"}, ENDPOINT)
    with pytest.raises(EngineError, match="extra_args must be a string or a list of strings"):
        launch_args(Path("/b"), Path("/m"), "s", {"extra_args": [1]}, ENDPOINT)
    # one grammar for every engine (adapters/launch.py): a string is split as a shell would
    assert launch_args(Path("/b"), Path("/m"), "s", {"extra_args": "--foo 'a b'"}, ENDPOINT)[-2:] == ["--foo", "a b"]


def test_find_llama_server_config_then_path_then_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    configured = tmp_path / "mine" / "llama-server"
    on_path = tmp_path / "path" / "llama-server"
    cached = tmp_path / "cache" / "bin" / "llama-server"
    for binary in (configured, on_path, cached):
        binary.parent.mkdir(parents=True)
        binary.write_text("#!/bin/sh\n")
        binary.chmod(0o755)
    monkeypatch.setenv("ENGINEGATE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert find_llama_server(str(configured)) == configured
    assert find_llama_server(str(tmp_path / "missing")) is None
    assert find_llama_server(None) == on_path
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert find_llama_server(None) == cached
    cached.unlink()
    assert find_llama_server(None) is None


def test_model_file_errors_clearly(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="needs a local GGUF file"):
        model_file(str(tmp_path / "nope.gguf"))
    real = tmp_path / "m.gguf"
    real.write_bytes(b"GGUF")
    assert model_file(str(real)) == real


async def test_start_without_binary_says_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = tmp_path / "m.gguf"
    real.write_bytes(b"GGUF")
    adapter = registry.create("llama_server", EngineConfig(source=str(real), name="m", options={"binary": str(tmp_path / "none")}))
    with pytest.raises(EngineError, match="enginegate engines install llama-server"):
        await adapter.start()


def test_install_is_a_no_op_when_binary_and_flags_match(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ENGINEGATE_CACHE", str(tmp_path))
    spec = engines.BuildSpec(engines.LLAMA_CPP_PYTHON_VERSION,
                             tuple(engines.host_cmake_args()) + engines._EXTRA_CMAKE_ARGS)
    binary = engines.cached_binary()
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    engines.stamp_path(binary).write_text(json.dumps(spec.stamp))
    assert engines.is_installed(binary, spec)
    assert "-DGGML_NATIVE=OFF" in spec.cmake_args or os.uname().machine not in ("x86_64", "amd64")
    assert not any(a.startswith("-DGGML_AMX") and a.endswith("=ON") for a in spec.cmake_args)
    assert engines.main(["engines", "install", "llama-server"]) == 0  # nothing to build
    assert "already installed" in capsys.readouterr().out
    other = engines.BuildSpec("0.0.1", spec.cmake_args)
    assert not engines.is_installed(binary, other), "another version must rebuild"


def test_registry_knows_the_engine_servers() -> None:
    assert registry.spec("llama_server").adapter is LlamaServerAdapter
    from adapters.external import ExternalAdapter

    assert registry.spec("openai").adapter is ExternalAdapter and registry.spec("external") is registry.spec("openai")
