"""The in-process llama.cpp engine with a quantised KV cache, for real: a workload's q8_0 reaches the plan's
options, the adapter loads llama.cpp with `type_k`/`type_v` q8_0 (flash attention on), and llama.cpp's
own state, whose size is the KV cache's bytes for the tokens held, shows q8_0's ~34/64 of f16's."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
openai = pytest.importorskip("openai")

import llama_cpp  # noqa: E402

from adapters.base import EngineError  # noqa: E402
from adapters.config import EngineConfig  # noqa: E402
from adapters.llamacpp import SPEC, LlamaCppAdapter  # noqa: E402
from gateway.config import ModelConfig, Settings  # noqa: E402
from gateway.modelsource import embedded_model_path  # noqa: E402
from gateway.planning import Workload  # noqa: E402
from gateway.runtime import Runtime  # noqa: E402
from tests.engines.harness import running_gateway  # noqa: E402

MODEL = "smollm-q8kv"
ASK = [{"role": "user", "content": "Name three colours of the rainbow."}]


def kv_state_bytes(adapter: LlamaCppAdapter) -> int:
    """llama.cpp's serialised state: logits, embeddings and the KV cells in use, at the cache's own type."""
    return int(llama_cpp.llama_state_get_size(adapter._llm._ctx.ctx))


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[openai.OpenAI, LlamaCppAdapter]]:
    settings = Settings(models=(ModelConfig(source=str(embedded_model_path()), name=MODEL, engine="llamacpp",
                                            embeddings=False, workload=Workload(kv_dtype="q8_0", context_length=512),
                                            options={"threads": 1}),))
    runtime = Runtime.build(settings)
    adapter = next(iter(runtime.models)).adapter
    assert isinstance(adapter, LlamaCppAdapter)
    with running_gateway(settings, runtime) as base_url:
        yield openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0), adapter


def test_the_workloads_q8_0_kv_reaches_llama_cpp(served: tuple[openai.OpenAI, LlamaCppAdapter]) -> None:
    client, adapter = served
    answer = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=16, temperature=0)  # type: ignore[arg-type]
    assert answer.choices[0].message.content
    assert adapter.kv_cache_type == "q8_0" and adapter.describe()["kv_cache_type"] == "q8_0"
    assert adapter._llm.context_params.type_k == adapter._llm.context_params.type_v == llama_cpp.GGML_TYPE_Q8_0
    held = adapter._llm.n_tokens
    q8_state = kv_state_bytes(adapter)

    # the same tokens in an f16 cache: llama.cpp's state is about 64/34 the size
    f16 = LlamaCppAdapter(EngineConfig(source=str(embedded_model_path()), name="f16", embeddings=False,
                                       options={"threads": 1, "context_length": 512}), SPEC)
    asyncio.run(f16.start())
    try:
        f16._llm.eval(adapter._llm._input_ids[:held].tolist())
        ratio = q8_state / kv_state_bytes(f16)
    finally:
        asyncio.run(f16.stop())
    assert 0.45 < ratio < 0.62, ratio


def test_an_unknown_kv_type_is_refused_before_loading() -> None:
    with pytest.raises(EngineError, match="unknown kv_cache_type 'q5_9'") as err:
        LlamaCppAdapter(EngineConfig(source=str(embedded_model_path()), options={"kv_cache_type": "q5_9"}), SPEC)
    assert err.value.code == "invalid_engine_options"
