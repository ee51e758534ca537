"""What each adapter says before any process starts: missing engine, bad option, unsuitable GPU; metric maps."""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any

import pytest

from adapters import registry
from adapters.base import EngineError
from adapters.dynamo import METRICS as DYNAMO_METRICS
from adapters.engine_server import EngineServer
from adapters.prom import engine_stats
from adapters.sglang import METRICS as SGLANG_METRICS
from adapters.tensorrt_llm import METRICS as TRTLLM_METRICS
from adapters.vllm import METRICS as VLLM_METRICS
from adapters.config import EngineConfig

SERVER_ENGINES = ["vllm", "sglang", "tensorrt_llm", "exllamav3", "exllamav2", "dynamo", "mlx_server"]


def adapter(engine: str, **options: Any) -> EngineServer:
    instance = registry.create(engine, EngineConfig(source="/models/m", name="m", options=options))
    assert isinstance(instance, EngineServer)
    return instance


@pytest.mark.parametrize("engine, module", [("vllm", "vllm"), ("sglang", "sglang"), ("dynamo", "dynamo")])
def test_a_missing_python_engine_names_the_install_command(engine: str, module: str) -> None:
    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed here")
    with pytest.raises(EngineError) as err:
        asyncio.run(adapter(engine).start())
    assert err.value.status == 503 and err.value.code == "engine_not_installed"
    assert "pip install" in err.value.message and engine in err.value.message


def test_a_missing_trtllm_serve_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(EngineError) as err:
        adapter("tensorrt_llm").check()
    assert "trtllm-serve is not on PATH" in err.value.message and "pip install tensorrt_llm" in err.value.message


@pytest.mark.parametrize("engine", ["exllamav3", "exllamav2"])
def test_tabby_engines_need_a_checkout(engine: str, tmp_path: Any) -> None:
    with pytest.raises(EngineError, match="options.tabby_dir is not set"):
        adapter(engine).check()
    with pytest.raises(EngineError, match="not a TabbyAPI checkout"):
        adapter(engine, tabby_dir=str(tmp_path)).check()


def test_exllamav2_install_hint_pins_tabby_before_it_dropped_exl2() -> None:
    with pytest.raises(EngineError, match="before 2026-07-14"):
        adapter("exllamav2").check()


def test_exllamav3_refuses_a_gpu_below_compute_capability_8(tmp_path: Any) -> None:
    (tmp_path / "main.py").write_text("")
    with pytest.raises(EngineError) as err:
        adapter("exllamav3", tabby_dir=str(tmp_path), compute_capability="7.5").check()
    assert "compute capability >= 8.0" in err.value.message and "7.5" in err.value.message
    adapter("exllamav3", tabby_dir=str(tmp_path), compute_capability="8.0").check()
    adapter("exllamav2", tabby_dir=str(tmp_path), compute_capability="7.5").check()


@pytest.mark.parametrize("engine", SERVER_ENGINES)
def test_a_bad_option_is_a_503_naming_it_not_a_traceback(engine: str) -> None:
    with pytest.raises(EngineError) as err:
        asyncio.run(adapter(engine, tensor_parallel="four").start())
    assert err.value.status == 503 and "options.tensor_parallel" in err.value.message


def test_dynamo_rejects_an_unknown_worker() -> None:
    with pytest.raises(EngineError, match="options.worker must be one of"):
        adapter("dynamo", worker="llamacpp", executable=["/bin/true"]).check()


@pytest.mark.parametrize("engine", SERVER_ENGINES)
def test_every_adapter_names_a_container_image_or_says_why_not(engine: str) -> None:
    image = registry.spec(engine).container_image
    if engine in ("mlx_server", "exllamav2"):
        assert image is None
    else:
        assert image and "/" in image


VLLM_TEXT = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 120.0
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="m"} 456.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.5
"""

SGLANG_TEXT = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 2.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 0.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.5
# TYPE sglang:prompt_tokens counter
sglang:prompt_tokens_total{model_name="m"} 10.0
# TYPE sglang:generation_tokens counter
sglang:generation_tokens_total{model_name="m"} 20.0
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_sum{model_name="m"} 1.5
sglang:time_to_first_token_seconds_count{model_name="m"} 3.0
"""

TRTLLM_TEXT = """\
# TYPE trtllm_num_requests_running gauge
trtllm_num_requests_running 1.0
# TYPE trtllm_num_requests_waiting gauge
trtllm_num_requests_waiting 2.0
# TYPE trtllm_kv_cache_utilization gauge
trtllm_kv_cache_utilization 0.75
# TYPE trtllm_prompt_tokens counter
trtllm_prompt_tokens_total 7.0
# TYPE trtllm_generation_tokens counter
trtllm_generation_tokens_total 9.0
# TYPE trtllm_time_to_first_token_seconds histogram
trtllm_time_to_first_token_seconds_sum 0.2
trtllm_time_to_first_token_seconds_count 2.0
"""

DYNAMO_TEXT = """\
# TYPE dynamo_frontend_inflight_requests gauge
dynamo_frontend_inflight_requests{model="m"} 1
# TYPE dynamo_frontend_queued_requests gauge
dynamo_frontend_queued_requests{model="m"} 0
# TYPE dynamo_frontend_input_sequence_tokens histogram
dynamo_frontend_input_sequence_tokens_bucket{model="m",le="+Inf"} 2
dynamo_frontend_input_sequence_tokens_sum{model="m"} 11
dynamo_frontend_input_sequence_tokens_count{model="m"} 2
# TYPE dynamo_frontend_output_tokens_total counter
dynamo_frontend_output_tokens_total{model="m"} 9
# TYPE dynamo_frontend_time_to_first_token_seconds histogram
dynamo_frontend_time_to_first_token_seconds_sum{model="m"} 0.03
dynamo_frontend_time_to_first_token_seconds_count{model="m"} 2
"""


@pytest.mark.parametrize("text, mapping, expected", [
    (VLLM_TEXT, VLLM_METRICS, (3, 1, 0.25, 120, 456, 0.5, 4)),
    (SGLANG_TEXT, SGLANG_METRICS, (2, 0, 0.5, 10, 20, 1.5, 3)),
    (TRTLLM_TEXT, TRTLLM_METRICS, (1, 2, 0.75, 7, 9, 0.2, 2)),
    (DYNAMO_TEXT, DYNAMO_METRICS, (1, 0, None, 11, 9, 0.03, 2)),
], ids=["vllm", "sglang", "tensorrt_llm", "dynamo"])
def test_engine_metrics_map_onto_engine_stats(text: str, mapping: Any, expected: tuple[float | None, ...]) -> None:
    s = engine_stats(text, mapping)
    got = (s.requests_running, s.requests_waiting, s.kv_cache_usage_ratio, s.prompt_tokens_total,
           s.generation_tokens_total, s.ttft_seconds_sum, s.ttft_seconds_count)
    assert got == pytest.approx(expected)
