"""An engine that serves /v1/responses itself (vLLM): the request passes through to it, made stateless,
and the gateway keeps the state. The engine is the emulator in vLLM's style, a real supervised process."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import openai
import orjson
import pytest
from fastapi.testclient import TestClient

from adapters.base import Capabilities
from adapters.config import EngineConfig
from gateway.app import create_app
from gateway.config import Settings
from gateway.runtime import runtime_for_adapters
from tests.integration.emulated_engine import SPEC, EmulatedEngine
from tests.unit.test_api_stream import metric_value

pytestmark = pytest.mark.integration
TEXT = "tok0 tok1 tok2 tok3"


NATIVE_RESPONSES = replace(SPEC, capabilities=Capabilities(responses=True, tools=True, structured_output=True))


def engine(tmp_path: Path, name: str, *flags: str) -> EmulatedEngine:
    options = {"style": "vllm", "flags": ["--tokens", "4", *flags], "log_dir": str(tmp_path)}
    adapter = NATIVE_RESPONSES.create(EngineConfig(source="emulated", name=name, options=options))
    assert isinstance(adapter, EmulatedEngine)
    return adapter


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    s = Settings(response_store={"path": tmp_path / "r.sqlite3"})
    adapters = {"emulated-model": engine(tmp_path, "emulated-model"),
                "failing": engine(tmp_path / "f", "failing", "--error-after-tokens", "2")}
    (tmp_path / "f").mkdir()
    with TestClient(create_app(s, runtime_for_adapters(s, adapters))) as c:  # type: ignore[arg-type]
        yield c


def test_native_pass_through_keeps_state_in_the_gateway(client: TestClient) -> None:
    oai = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=client, max_retries=0)
    first = oai.responses.create(model="emulated-model", input="a b c")
    assert first.output_text == TEXT and first.store is True  # the engine was sent store=false; the client sees its own
    assert first.usage is not None and (first.usage.input_tokens, first.usage.output_tokens) == (3, 4)
    # the emulated engine keeps no state and 404s any previous_response_id: the gateway resolved it into input
    stream = oai.responses.create(model="emulated-model", input="d", previous_response_id=first.id, stream=True)
    events = list(stream)
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    second = events[-1].response  # type: ignore[union-attr]
    assert second.previous_response_id == first.id and second.output_text == TEXT
    assert second.usage is not None and second.usage.input_tokens == 3 + 4 + 1  # history + first output + new input
    assert oai.responses.retrieve(second.id).output_text == TEXT
    assert [i.type for i in oai.responses.input_items.list(second.id).data] == ["message"]
    text = client.get("/metrics").text
    assert metric_value(text, "enginegate_time_to_first_token_seconds_count", model="emulated-model") == 1
    assert metric_value(text, "enginegate_completion_tokens_total", model="emulated-model") == 8
    assert metric_value(text, "enginegate_requests_total", route="/v1/responses", model="emulated-model", status="200") == 2


def test_native_failure_mid_stream_passes_the_engines_events(client: TestClient) -> None:
    r = client.post("/v1/responses", json={"model": "failing", "input": "a", "stream": True})
    kinds = [orjson.loads(b.split("\ndata: ", 1)[1])["type"] for b in r.text.split("\n\n") if b]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-2:] == ["error", "response.failed"]
    text = client.get("/metrics").text
    assert metric_value(text, "enginegate_errors_total", model="failing", type="engine_stream") == 1
