"""The command line each engine adapter builds, for representative plans (no engine needed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from adapters.base import EngineError
from adapters.dynamo import frontend_argv, worker_argv
from adapters.exllama import TabbyAdapter, cache_mode, tabby_config
from adapters.launch import LaunchConfigError, launch_options
from adapters.mlx_server import mlx_server_argv
from adapters.process import Endpoint
from adapters.sglang import sglang_argv
from adapters.tensorrt_llm import extra_options, trtllm_argv
from adapters.vllm import VllmServer, vllm_argv, vllm_env
from adapters import registry, vllm
from adapters.config import EngineConfig

EP = Endpoint("127.0.0.1", 9000, "KEY")
NO_KEY = Endpoint("127.0.0.1", 9000, "")
MODEL = "/models/llama-70b"
PY = "/venv/bin/python"

SINGLE: dict[str, Any] = {"python": PY, "context_length": 8192, "gpu_memory_fraction": 0.85}
TP4: dict[str, Any] = {"python": PY, "tensor_parallel": 4, "quantization": "fp8", "kv_cache_dtype": "fp8"}
PP2_NODES: dict[str, Any] = {
    "python": PY, "tensor_parallel": 8, "pipeline_parallel": 2, "nodes": 2, "node_rank": 0,
    "master_addr": "10.0.0.1:5000", "hosts": ["10.0.0.1", "10.0.0.2"], "metrics": False,
}


def tail(argv: list[str], prefix_len: int) -> list[str]:
    return argv[prefix_len:]


VLLM_HEAD = [PY, "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL, "--served-model-name", "llama",
             "--host", "127.0.0.1", "--port", "9000"]


@pytest.mark.parametrize("options, endpoint, expected", [
    (SINGLE, EP, VLLM_HEAD + ["--max-model-len", "8192", "--gpu-memory-utilization", "0.85",
                              "--enable-prompt-tokens-details"]),
    (TP4, EP, VLLM_HEAD + ["--tensor-parallel-size", "4", "--quantization", "fp8",
                           "--kv-cache-dtype", "fp8", "--enable-prompt-tokens-details"]),
    (PP2_NODES, NO_KEY, VLLM_HEAD + ["--tensor-parallel-size", "8", "--pipeline-parallel-size", "2",
                                     "--distributed-executor-backend", "mp", "--nnodes", "2", "--node-rank", "0",
                                     "--master-addr", "10.0.0.1", "--master-port", "5000",
                                     "--enable-prompt-tokens-details", "--disable-log-stats"]),
], ids=["single-gpu", "tp4", "2-node-pp"])
def test_vllm(options: dict[str, Any], endpoint: Endpoint, expected: list[str]) -> None:
    assert vllm_argv(MODEL, "llama", launch_options(options), endpoint) == expected


def test_vllm_second_node_runs_headless() -> None:
    argv = vllm_argv(MODEL, "llama", launch_options({**PP2_NODES, "node_rank": 1}), NO_KEY)
    assert argv[argv.index("--node-rank") + 1] == "1" and "--headless" in argv


def test_vllm_key_travels_in_the_environment_not_argv() -> None:
    assert "KEY" not in vllm_argv(MODEL, "llama", launch_options(SINGLE), EP)
    assert vllm_env(EP) == {"VLLM_API_KEY": "KEY", "VLLM_HOST_IP": "127.0.0.1"}


SGL_HEAD = [PY, "-m", "sglang.launch_server", "--model-path", MODEL, "--served-model-name", "llama",
            "--host", "127.0.0.1", "--port", "9000"]


@pytest.mark.parametrize("options, endpoint, expected", [
    (SINGLE, EP, SGL_HEAD + ["--api-key", "KEY", "--context-length", "8192", "--mem-fraction-static", "0.85",
                             "--enable-metrics"]),
    (TP4, EP, SGL_HEAD + ["--api-key", "KEY", "--tp-size", "4", "--quantization", "fp8", "--kv-cache-dtype", "fp8",
                          "--enable-metrics"]),
    (PP2_NODES, NO_KEY, SGL_HEAD + ["--tp-size", "8", "--pp-size", "2", "--nnodes", "2", "--node-rank", "0",
                                    "--dist-init-addr", "10.0.0.1:5000"]),
], ids=["single-gpu", "tp4", "2-node-pp"])
def test_sglang(options: dict[str, Any], endpoint: Endpoint, expected: list[str]) -> None:
    assert sglang_argv(MODEL, "llama", launch_options(options), endpoint) == expected


TRT_HEAD = ["trtllm-serve", MODEL, "--host", "127.0.0.1", "--port", "9000", "--backend", "pytorch"]


@pytest.mark.parametrize("options, extra_file, expected", [
    (SINGLE, "/run/x.yaml", TRT_HEAD + ["--max_seq_len", "8192", "--kv_cache_free_gpu_memory_fraction", "0.85",
                                        "--extra_llm_api_options", "/run/x.yaml"]),
    (TP4, "/run/x.yaml", TRT_HEAD + ["--tp_size", "4", "--extra_llm_api_options", "/run/x.yaml"]),
    (PP2_NODES, None, ["mpirun", "--allow-run-as-root", "-n", "16", "-H", "10.0.0.1:8,10.0.0.2:8",
                       "trtllm-llmapi-launch"] + TRT_HEAD + ["--tp_size", "8", "--pp_size", "2"]),
], ids=["single-gpu", "tp4", "2-node-pp"])
def test_tensorrt_llm(options: dict[str, Any], extra_file: str | None, expected: list[str]) -> None:
    assert trtllm_argv(MODEL, launch_options(options), NO_KEY, "pytorch", extra_file) == expected


def test_tensorrt_llm_extra_options_carry_kv_dtype_and_perf_metrics() -> None:
    assert extra_options(launch_options(TP4)) == {
        "kv_cache_config": {"dtype": "fp8"}, "return_perf_metrics": True, "enable_iter_perf_stats": True,
    }
    assert extra_options(launch_options(PP2_NODES)) == {}


@pytest.mark.parametrize("options, expected_model", [
    (SINGLE, {"model_dir": "/models", "model_name": "llama-70b", "backend": "exllamav3", "cache_mode": "FP16",
              "tensor_parallel": False, "gpu_split_auto": True, "max_seq_len": 8192, "cache_size": 8192}),
    ({**TP4, "kv_cache_dtype": "q4"}, {"model_dir": "/models", "model_name": "llama-70b", "backend": "exllamav3",
                                       "cache_mode": "Q4", "tensor_parallel": True, "gpu_split_auto": True}),
], ids=["single-gpu", "tp4"])
def test_tabby_config(options: dict[str, Any], expected_model: dict[str, Any]) -> None:
    config = tabby_config(MODEL, "llama", launch_options(options), EP, "exllamav3")
    assert config["model"] == expected_model
    assert config["network"] == {"host": "127.0.0.1", "port": 9000, "disable_auth": False, "api_servers": ["OAI"]}


def test_tabby_rejects_a_kv_dtype_it_has_no_cache_mode_for() -> None:
    with pytest.raises(EngineError, match="no TabbyAPI cache mode"):
        cache_mode("bf16")


def test_tabby_adapter_writes_config_and_keys_in_its_own_run_dir(tmp_path: Path) -> None:
    tabby = tmp_path / "tabbyAPI"
    tabby.mkdir()
    (tabby / "main.py").write_text("")
    adapter = registry.create("exllamav3", EngineConfig(source=MODEL, name="llama", options={"tabby_dir": str(tabby)}))
    assert isinstance(adapter, TabbyAdapter)
    launch = adapter.launch(EP)
    assert launch.argv[1:] == [str(tabby / "main.py"), "--config", str(Path(launch.cwd or "") / "config.yml")]
    assert Path(launch.cwd or "") != tabby
    tokens = yaml.safe_load((Path(launch.cwd or "") / "api_tokens.yml").read_text())
    assert tokens["api_key"] == "KEY" and tokens["admin_key"] and tokens["admin_key"] != "KEY"
    adapter.check()


@pytest.mark.parametrize("options, expected", [
    (SINGLE, ["--model", MODEL, "--served-model-name", "llama", "--max-model-len", "8192",
              "--gpu-memory-utilization", "0.85"]),
    (TP4, ["--model", MODEL, "--served-model-name", "llama", "--tensor-parallel-size", "4", "--quantization", "fp8",
           "--kv-cache-dtype", "fp8"]),
    (PP2_NODES, ["--model", MODEL, "--served-model-name", "llama", "--tensor-parallel-size", "8",
                 "--pipeline-parallel-size", "2"]),
], ids=["single-gpu", "tp4", "2-node-pp"])
def test_dynamo_vllm_worker(options: dict[str, Any], expected: list[str]) -> None:
    argv = worker_argv("vllm", MODEL, "llama", launch_options(options), "etcd")
    assert argv == [PY, "-m", "dynamo.vllm", *expected, "--discovery-backend", "etcd"]


def test_dynamo_sglang_and_trtllm_workers_use_their_engines_flags() -> None:
    sgl = worker_argv("sglang", MODEL, "llama", launch_options(PP2_NODES), "etcd")
    assert sgl[3:] == ["--model-path", MODEL, "--served-model-name", "llama", "--tp-size", "8", "--pp-size", "2",
                       "--nnodes", "2", "--node-rank", "0", "--dist-init-addr", "10.0.0.1:5000",
                       "--discovery-backend", "etcd"]
    trt = worker_argv("trtllm", MODEL, "llama", launch_options(TP4), "file")
    assert trt[3:] == ["--model", MODEL, "--served-model-name", "llama", "--tensor-parallel-size", "4",
                       "--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq"]
    mock = worker_argv("mocker", MODEL, "llama", launch_options(SINGLE), "file")
    assert mock[1:7] == ["-m", "dynamo.mocker", "--model-path", MODEL, "--model-name", "llama"]


def test_dynamo_frontend() -> None:
    assert frontend_argv(launch_options(SINGLE), NO_KEY, "file", "kv") == [
        PY, "-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", "9000", "--router-mode", "kv",
        "--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq",
    ]


def test_mlx_server() -> None:
    assert mlx_server_argv(MODEL, launch_options({"python": PY}), NO_KEY, 512) == [
        PY, "-m", "mlx_lm", "server", "--model", MODEL, "--host", "127.0.0.1", "--port", "9000", "--max-tokens", "512",
    ]


def test_executable_replaces_only_the_program() -> None:
    argv = vllm_argv(MODEL, "llama", launch_options({"executable": "/opt/vllm/bin/vllm-wrapper --flag"}), NO_KEY)
    assert argv[:2] == ["/opt/vllm/bin/vllm-wrapper", "--flag"] and argv[2:4] == ["--model", MODEL]


@pytest.mark.parametrize("options, message", [
    ({"tensor_parallel": 0}, "options.tensor_parallel must be a positive integer"),
    ({"gpu_memory_fraction": 1.5}, "options.gpu_memory_fraction must be in (0, 1]"),
    ({"nodes": 2}, "options.master_addr"),
    ({"nodes": 2, "master_addr": "h:1", "node_rank": 2}, "options.node_rank must be in [0, 2)"),
    ({"extra_args": [1]}, "options.extra_args must be a string or a list of strings"),
    ({"env": ["A=1"]}, "options.env must be a mapping"),
])
def test_bad_options_name_the_option(options: dict[str, Any], message: str) -> None:
    with pytest.raises(LaunchConfigError) as err:
        launch_options(options)
    assert message in str(err.value)


def test_data_parallel_replicas_reach_vllm_and_sglang() -> None:
    opts = launch_options({"python": PY, "data_parallel": 2})
    vllm = vllm_argv(MODEL, "llama", opts, EP)
    sgl = sglang_argv(MODEL, "llama", opts, EP)
    assert vllm[vllm.index("--data-parallel-size") + 1] == "2" and sgl[sgl.index("--dp-size") + 1] == "2"
    assert "--data-parallel-size" not in vllm_argv(MODEL, "llama", launch_options({"python": PY}), EP)


def test_vllm_scheduling_policy_flag() -> None:
    argv = vllm_argv(MODEL, "llama", launch_options(SINGLE), NO_KEY, scheduling_policy="priority")
    assert argv[argv.index("--scheduling-policy") + 1] == "priority"
    assert "--scheduling-policy" not in vllm_argv(MODEL, "llama", launch_options(SINGLE), NO_KEY)


def test_vllm_kv_events_publish_on_private_ipc_sockets_with_prefix_caching_on() -> None:
    adapter = registry.create("vllm", EngineConfig(source=MODEL, name="llama", options={**SINGLE, "kv_events": True}))
    assert isinstance(adapter, VllmServer)
    try:
        argv = adapter.launch(EP).argv
        config = json.loads(argv[argv.index("--kv-events-config") + 1])
        folder = adapter.run_dir("kv")
        assert config == {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"ipc://{folder}/9000.events",
                          "replay_endpoint": f"ipc://{folder}/9000.replay", "buffer_steps": 10000}
        assert oct(adapter.run_dir().stat().st_mode & 0o777) == "0o700"  # no other user reads the prompts' tokens
        assert "--enable-prefix-caching" in argv and "--enable-prompt-tokens-details" in argv
        assert adapter.describe()["kv_events_endpoint"] is None  # not launched: nothing to subscribe to
    finally:
        adapter.remove_run_dir()
    plain = vllm_argv(MODEL, "llama", launch_options(SINGLE), EP)
    assert "--kv-events-config" not in plain and "--enable-prefix-caching" not in plain


@pytest.mark.parametrize("options, message", [
    ({"kv_events": "yes"}, "options.kv_events must be true or false"),
    ({"kv_events": True, "prefix_caching": False}, "needs prefix caching"),
    ({"kv_events": True, "data_parallel": 2}, "one data-parallel rank"),
    ({"kv_events": True, "python": PY, "__hide_reader__": True}, "pip install 'enginegate[kv-events]'"),
])
def test_vllm_kv_events_refuse_what_cannot_work(options: dict[str, Any], message: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    options = dict(options)
    if options.pop("__hide_reader__", False):  # a gateway installed without the kv-events extra
        monkeypatch.setattr(vllm, "KV_EVENTS_READER", ("zmq", "not_installed_here"))
    adapter = registry.create("vllm", EngineConfig(source=MODEL, name="llama", options={**SINGLE, **options}))
    assert isinstance(adapter, VllmServer)
    with pytest.raises(EngineError) as err:
        adapter.check()
    assert message in str(err.value)
