"""`mlx_lm.server` for real, started by the adapter, next to the in-process MLX adapter in one gateway.

Both load the same tiny random-weight llama, so greedy output must agree: a cross-check of the
in-process adapter (template, sampler, detokenisation) against MLX's own server.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

pytest.importorskip("mlx_lm", reason="mlx-lm is not installed: pip install 'mlx[cpu]' mlx-lm")
openai = pytest.importorskip("openai")

from adapters.mlx_server import MLXServerAdapter  # noqa: E402
from gateway.config import ModelConfig, Settings  # noqa: E402
from gateway.runtime import Runtime  # noqa: E402
from tests.engines.harness import running_gateway  # noqa: E402
from tests.engines.tiny_model import build_tiny_llama  # noqa: E402

pytestmark = pytest.mark.integration
USER = [{"role": "user", "content": "say hi"}]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[openai.OpenAI, MLXServerAdapter]]:
    root = tmp_path_factory.mktemp("mlx-server")
    model = build_tiny_llama(root / "tiny")
    copy = shutil.copytree(model, root / "tiny-copy")  # a second directory: the gateway aliases models by name
    settings = Settings(models=(
        ModelConfig(source=str(model), name="inproc", engine="mlx", context_length=512),
        ModelConfig(source=str(copy), name="server", engine="mlx_server", options={"log_dir": str(root / "logs")}),
    ))
    runtime = Runtime.build(settings)
    server = [b.adapter for b in runtime.models if b.model_id == "server"][0]
    assert isinstance(server, MLXServerAdapter)
    with running_gateway(settings, runtime) as base_url:
        yield openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0), server
    assert server.process.pid is None or not _alive(server.process.pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_server_and_in_process_agree_under_greedy(gateway) -> None:
    client, _ = gateway
    a = client.chat.completions.create(model="inproc", messages=USER, max_tokens=12, temperature=0)
    b = client.chat.completions.create(model="server", messages=USER, max_tokens=12, temperature=0)
    assert a.choices[0].message.content and a.choices[0].message.content == b.choices[0].message.content
    assert a.usage is not None and b.usage is not None
    assert (a.usage.prompt_tokens, a.usage.completion_tokens) == (b.usage.prompt_tokens, b.usage.completion_tokens)


def test_server_stream_through_the_gateway(gateway) -> None:
    client, _ = gateway
    whole = client.chat.completions.create(model="server", messages=USER, max_tokens=8, temperature=0)
    chunks = list(client.chat.completions.create(
        model="server", messages=USER, max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    plain = list(client.chat.completions.create(model="server", messages=USER, max_tokens=8, temperature=0, stream=True))
    assert all(c.choices for c in plain)


def test_server_text_completions_agree_with_in_process(gateway) -> None:
    client, _ = gateway
    a = client.completions.create(model="inproc", prompt="the quick brown", max_tokens=6, temperature=0)
    b = client.completions.create(model="server", prompt="the quick brown", max_tokens=6, temperature=0)
    assert a.choices[0].text and a.choices[0].text == b.choices[0].text


def test_server_bare_string_error_becomes_an_openai_400(gateway) -> None:
    client, _ = gateway
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="server", messages=USER, max_tokens=4, extra_body={"top_k": "many"})
    assert "top_k" in err.value.message


def test_server_readiness_waited_for_a_generation_not_health(gateway) -> None:
    _, server = gateway
    log = "\n".join(server.logs(400))
    assert "POST /v1/chat/completions" in log, "readiness is a one-token generation"
    assert server.process.restarts == 0
