"""LoRA adapters where the in-process llama.cpp engine would serve: an auto plan goes to llama-server (which
selects an adapter per request); the in-process engine named explicitly answers the documented 400 for an
adapter's name and keeps serving its base. Real llama-cpp-python, the embedded model, the official client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
openai = pytest.importorskip("openai")

from gateway.config import LoraConfig, ModelConfig, Settings  # noqa: E402
from gateway.modelsource import embedded_model_path  # noqa: E402
from gateway.runtime import Runtime  # noqa: E402
from tests.engines.harness import running_gateway  # noqa: E402
from tests.lora_adapters import make_lora  # noqa: E402

ASK = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def adapter_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_lora(embedded_model_path(), tmp_path_factory.mktemp("lora") / "a.gguf", seed=1)


def test_an_auto_plan_with_adapters_is_served_by_llama_server(adapter_file: Path) -> None:
    plain = Runtime.build(Settings(models=(ModelConfig(name="smollm"),)))
    assert next(iter(plain.models)).engine == "llamacpp"  # one stream on this host: in-process
    runtime = Runtime.build(Settings(models=(ModelConfig(name="smollm", adapters=(
        LoraConfig(name="tone-a", path=str(adapter_file)),)),)))
    base = next(iter(runtime.models))
    assert base.engine == "llama_server" and any("1 LoRA adapter(s): served by llama_server" in r
                                                 for r in base.plan.reasons)
    adapter = runtime.models.get("tone-a")
    assert adapter is not None and adapter.parent == "smollm" and adapter.replicas is base.replicas
    assert [a.name for a in base.adapter.loras] == ["tone-a"]  # type: ignore[attr-defined]
    # the lifecycle charges the adapter's bytes beside the base's
    plain_charge = sum(next(iter(plain.lifecycles)).charges.values())
    assert sum(next(iter(runtime.lifecycles)).charges.values()) == plain_charge + adapter_file.stat().st_size


@pytest.fixture(scope="module")
def in_process(adapter_file: Path) -> Iterator[openai.OpenAI]:
    settings = Settings(models=(ModelConfig(name="smollm", engine="llamacpp", embeddings=False, context_length=512,
                                            options={"threads": 1},
                                            adapters=(LoraConfig(name="tone-a", path=str(adapter_file)),)),))
    with running_gateway(settings, Runtime.build(settings)) as base_url:
        yield openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)


def test_the_in_process_engine_refuses_an_adapter_with_400_and_serves_the_base(in_process: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        in_process.chat.completions.create(model="tone-a", messages=ASK, max_tokens=4)  # type: ignore[arg-type]
    assert err.value.code == "unsupported_parameter" and err.value.param == "model"  # type: ignore[attr-defined]
    assert "cannot select an adapter per request" in err.value.message
    assert in_process.chat.completions.create(model="smollm", messages=ASK, max_tokens=4).choices  # type: ignore[arg-type]
    assert {"smollm", "tone-a"} <= {m.id for m in in_process.models.list().data}
