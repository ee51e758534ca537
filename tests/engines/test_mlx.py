"""MLX in-process, for real: mlx_lm on this CPU with a tiny random-weight llama built here, through the gateway."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("mlx_lm", reason="mlx-lm is not installed: pip install 'mlx[cpu]' mlx-lm")
openai = pytest.importorskip("openai")

from adapters.base import EngineError  # noqa: E402
from adapters import registry  # noqa: E402
from adapters.config import EngineConfig  # noqa: E402
from adapters.mlx import MLXAdapter  # noqa: E402
from gateway.config import ModelConfig, Settings  # noqa: E402
from gateway.runtime import Runtime  # noqa: E402
from tests.engines.harness import running_gateway  # noqa: E402
from tests.engines.tiny_model import build_tiny_llama  # noqa: E402

MODEL = "tiny-mlx"
CONTEXT = 512
USER = [{"role": "user", "content": "hello world"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def gateway(model_dir: Path) -> Iterator[tuple[openai.OpenAI, MLXAdapter]]:
    settings = Settings(models=(ModelConfig(source=str(model_dir), name=MODEL, engine="mlx", context_length=CONTEXT),))
    runtime = Runtime.build(settings)
    adapter = next(iter(runtime.models)).adapter
    assert isinstance(adapter, MLXAdapter)
    with running_gateway(settings, runtime) as base_url:
        yield openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0), adapter


def expected_prompt_tokens(model_dir: Path) -> int:
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(str(model_dir))
    text = tok.apply_chat_template(USER, add_generation_prompt=True, tokenize=False)
    return len(tok.encode(text, add_special_tokens=False))


def greedy(client: openai.OpenAI, max_tokens: int = 16, **extra: object) -> openai.types.chat.ChatCompletion:
    params: dict[str, object] = {"temperature": 0, **extra}
    return client.chat.completions.create(model=MODEL, messages=USER, max_tokens=max_tokens, **params)


def drain(adapter: MLXAdapter) -> None:
    """Wait until the model's worker thread has finished whatever it was running."""
    adapter._executor.submit(lambda: None).result()


def test_chat_non_stream_is_deterministic_under_greedy_and_counts_usage(gateway, model_dir: Path) -> None:
    client, _ = gateway
    first, second = greedy(client), greedy(client)
    text = first.choices[0].message.content
    assert text and text == second.choices[0].message.content
    assert first.model == MODEL and first.object == "chat.completion"
    assert first.usage is not None
    assert first.usage.prompt_tokens == expected_prompt_tokens(model_dir)
    if first.choices[0].finish_reason == "length":
        assert first.usage.completion_tokens == 16
    else:
        assert first.choices[0].finish_reason == "stop" and 0 < first.usage.completion_tokens < 16


def test_chat_stream_yields_the_same_text_with_role_finish_and_usage(gateway) -> None:
    client, _ = gateway
    whole = greedy(client)
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=USER, max_tokens=16, temperature=0, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_stop_sequence_cuts_the_text_before_it(gateway) -> None:
    client, _ = gateway
    text = greedy(client, max_tokens=24).choices[0].message.content
    assert text is not None and len(text) >= 8, f"the tiny model wrote too little to test stops: {text!r}"
    stop = text[5:8]
    expected = text[: text.find(stop)]
    cut = greedy(client, max_tokens=24, stop=[stop, "never-appears"])
    assert cut.choices[0].message.content == expected
    assert cut.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=24, temperature=0, stop=stop, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == expected


def test_seeded_sampling_repeats_and_temperature_changes_the_text(gateway) -> None:
    client, _ = gateway
    a = greedy(client, max_tokens=24, temperature=1.0, seed=7).choices[0].message.content
    b = greedy(client, max_tokens=24, temperature=1.0, seed=7).choices[0].message.content
    g = greedy(client, max_tokens=24).choices[0].message.content
    assert a == b
    assert a != g


def test_text_completions(gateway) -> None:
    client, _ = gateway
    result = client.completions.create(model=MODEL, prompt="the quick brown", max_tokens=8, temperature=0)
    assert result.object == "text_completion" and result.choices[0].text
    assert result.usage is not None and result.usage.completion_tokens <= 8
    streamed = client.completions.create(model=MODEL, prompt="the quick brown", max_tokens=8, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == result.choices[0].text


def test_over_the_context_is_a_400_naming_the_limit(gateway) -> None:
    client, _ = gateway
    with pytest.raises(openai.BadRequestError) as err:
        greedy(client, max_tokens=CONTEXT)
    assert f"context is {CONTEXT} tokens" in str(err.value)
    with pytest.raises(openai.BadRequestError, match="tools"):
        greedy(client, tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])


def test_closing_a_stream_stops_generation(gateway) -> None:
    client, adapter = gateway
    drain(adapter)
    before = asyncio.run(adapter.engine_stats())
    stream = client.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=480, temperature=0, stream=True
    )
    received = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            received += 1
            if received == 2:
                break
    stream.close()
    drain(adapter)
    after = asyncio.run(adapter.engine_stats())
    assert after.requests_running == 0
    generated = (after.generation_tokens_total or 0) - (before.generation_tokens_total or 0)
    assert 2 <= generated < 480


def test_missing_mlx_says_what_to_install(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mlx_lm", None)
    adapter = registry.create("mlx", EngineConfig(source=str(model_dir)))
    with pytest.raises(EngineError) as err:
        asyncio.run(adapter.start())
    assert "pip install" in err.value.message and "mlx" in err.value.message
    assert err.value.code == "engine_not_installed"
    asyncio.run(adapter.stop())


def test_a_file_instead_of_a_model_directory_is_named(tmp_path: Path) -> None:
    weights = tmp_path / "model.gguf"
    weights.write_bytes(b"GGUF")
    adapter = registry.create("mlx", EngineConfig(source=str(weights)))
    with pytest.raises(EngineError, match="no config.json"):
        asyncio.run(adapter.start())
    asyncio.run(adapter.stop())
