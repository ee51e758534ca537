"""engine: openai — an already-running OpenAI-compatible server (here: the vLLM emulator, with a key)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import openai
import pytest
import pytest_asyncio

from adapters.base import Completion, EngineError, RequestContext
from adapters.external import ExternalAdapter
from adapters.process import free_port
from gateway.app import create_app
from adapters import registry
from adapters.config import EngineConfig
from gateway.config import ModelConfig, Settings
from gateway.routing import Admission, Backend, ModelRegistry
from gateway.runtime import Runtime
from tests.emulators.fixture import RunningEmulator, running_emulator
from tests.gateway_process import app_server


def make_external(config: EngineConfig) -> ExternalAdapter:
    adapter = registry.create("openai", config)
    assert isinstance(adapter, ExternalAdapter)
    return adapter

pytestmark = pytest.mark.integration
KEY = "sk-upstream"


@pytest.fixture(scope="module")
def emu() -> Iterator[RunningEmulator]:
    with running_emulator("vllm", "--api-key", KEY, "--tokens", "4") as e:
        yield e


def adapter(emu: RunningEmulator, **options: object) -> ExternalAdapter:
    opts = {"base_url": emu.base_url, "api_key": KEY, "upstream_model": "emulated-model", **options}
    return make_external(EngineConfig(source="remote", name="remote", options=opts))


@pytest_asyncio.fixture
async def gateway_url(emu: RunningEmulator) -> AsyncIterator[str]:
    models = ModelRegistry()
    models.add(Backend(model_id="remote", adapter=adapter(emu), admission=Admission(8, 16)))
    settings = Settings()
    async with app_server(create_app(settings, Runtime(settings=settings, models=models))) as url:
        yield url + "/v1"


async def test_chat_through_the_gateway_under_another_name(gateway_url: str) -> None:
    client = openai.AsyncOpenAI(base_url=gateway_url, api_key="x", max_retries=0)
    # vLLM answers 404 for a model id it does not serve: success proves upstream_model was sent
    whole = await client.chat.completions.create(model="remote", messages=[{"role": "user", "content": "a b"}])
    assert whole.choices[0].message.content == "tok0 tok1 tok2 tok3" and whole.usage.prompt_tokens == 2  # type: ignore[union-attr]
    stream = await client.chat.completions.create(model="remote", messages=[{"role": "user", "content": "a"}],
                                                  stream=True)
    assert "".join([c.choices[0].delta.content or "" async for c in stream if c.choices]) == "tok0 tok1 tok2 tok3"
    with pytest.raises(openai.BadRequestError, match="maximum context length is 4096 tokens") as info:
        await client.chat.completions.create(model="remote", messages=[{"role": "user", "content": "a"}], max_tokens=5000)
    assert info.value.body["param"] == "messages"  # type: ignore[index]  # the engine's own error, relayed


async def test_start_checks_reachability_key_and_model(emu: RunningEmulator) -> None:
    good = adapter(emu)
    await good.start()
    assert (await good.health()).ready
    await good.stop()
    for bad, message in (
        (adapter(emu, api_key="wrong"), "rejected the gateway's credentials"),
        (adapter(emu, upstream_model="other"), "does not serve 'other'; it serves: emulated-model"),
        (adapter(emu, base_url=f"http://127.0.0.1:{free_port()}"), "is unreachable"),
    ):
        with pytest.raises(EngineError, match=message):
            await bad.start()
        assert not (await bad.health()).ready
        await bad.stop()


def test_configuration_errors_are_clear(monkeypatch: pytest.MonkeyPatch) -> None:
    def make(**options: object) -> ExternalAdapter:
        return make_external(EngineConfig(source="x", name="x", options=options))

    with pytest.raises(ValueError, match="needs options.base_url"):
        make()
    with pytest.raises(ValueError, match="must be an http"):
        make(base_url="ftp://host")
    with pytest.raises(ValueError, match="not set"):
        make(base_url="http://h:1", api_key_env="ENGINEGATE_TEST_UNSET_KEY")
    monkeypatch.setenv("ENGINEGATE_TEST_KEY", "sk-env")
    made = make(base_url="http://h:1/v1/", api_key_env="ENGINEGATE_TEST_KEY")
    assert made.upstream.base_url == "http://h:1" and made.upstream.api_key == "sk-env" and made.upstream.model == "x"


async def test_engine_openai_from_configuration(emu: RunningEmulator) -> None:
    """Settings -> Runtime.build: a remote model needs no local file and no plan."""
    config = ModelConfig(source="remote-model", name="remote", engine="openai",
                         options={"base_url": emu.base_url, "api_key": KEY, "upstream_model": "emulated-model"})
    runtime = Runtime.build(Settings(models=(config,)))
    backend = runtime.models.get("remote")
    assert backend is not None and backend.engine == "openai" and runtime.models.get("default") is backend
    await runtime.start()
    try:
        result = await backend.adapter.chat({"model": "remote", "messages": [{"role": "user", "content": "x"}]},
                                            RequestContext("r", "remote"))
        assert isinstance(result, Completion) and result.usage is not None and result.usage.completion_tokens == 4
    finally:
        await runtime.stop()
