"""The relay against each engine's emulator (a real process): pass-through, usage, errors, faults."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import orjson
import pytest

from adapters.base import ClientRequestError, Completion, EngineError, RequestContext, StreamEvent, Usage
from adapters.openai_http import Relay, Timeouts, Upstream
from tests.emulators.fixture import RunningEmulator, free_port, running_emulator

pytestmark = pytest.mark.integration

STYLES = ["llamacpp", "vllm", "sglang", "trtllm", "tabby", "mlx", "dynamo"]
KEY = "relay-test-key"
CHAT = "/v1/chat/completions"
PROMPT = {"model": "emulated-model", "messages": [{"role": "user", "content": "one two three"}]}


def counts(usage: Usage | None) -> tuple[int, int] | None:
    """Prompt and completion tokens (the engines that report timings add their cache and prefill figures)."""
    return None if usage is None else (usage.prompt_tokens, usage.completion_tokens)


@pytest.fixture(scope="module", params=STYLES)
def emu(request: pytest.FixtureRequest) -> Iterator[RunningEmulator]:
    with running_emulator(request.param, "--api-key", KEY, "--tokens", "5", "--metrics") as e:
        yield e


def upstream(emu: RunningEmulator, key: str = KEY) -> Upstream:
    return Upstream(emu.url, key)


def ctx(include_usage: bool = False) -> RequestContext:
    return RequestContext("req-1", "emulated-model", include_usage=include_usage)


async def collect(result: object) -> list[StreamEvent]:
    assert not isinstance(result, Completion)
    events: AsyncIterator[StreamEvent] = result  # type: ignore[assignment]
    return [event async for event in events]


async def test_stream_passes_events_through_and_drops_unasked_usage(emu: RunningEmulator) -> None:
    relay = Relay(emu.style)
    try:
        events = await collect(await relay.forward(upstream(emu), CHAT, {**PROMPT, "stream": True}, ctx()))
    finally:
        await relay.aclose()
    sent = [e for e in events if e.data]
    assert all(not e.is_error for e in events)
    chunks = [orjson.loads(e.data) for e in sent]
    assert all(c["choices"] for c in chunks), "the usage-only chunk the client did not ask for must not be sent"
    text = "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks)
    assert text == "tok0 tok1 tok2 tok3 tok4"
    assert sum(e.has_content for e in events) == 5
    assert [e.finish_reason for e in events if e.finish_reason] == ["stop"]
    observed = [e for e in events if not e.data]
    assert len(observed) == 1 and counts(observed[0].usage) == (3, 5)


async def test_stream_keeps_usage_the_client_asked_for(emu: RunningEmulator) -> None:
    relay = Relay(emu.style)
    body = {**PROMPT, "stream": True, "stream_options": {"include_usage": True}}
    try:
        events = await collect(await relay.forward(upstream(emu), CHAT, body, ctx(include_usage=True)))
    finally:
        await relay.aclose()
    assert all(e.data for e in events)
    last = orjson.loads(events[-1].data)
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 5
    assert counts(events[-1].usage) == (3, 5)


async def test_completions_stream_and_whole(emu: RunningEmulator) -> None:
    relay = Relay(emu.style)
    body = {"model": "emulated-model", "prompt": "a b", "max_tokens": 3}
    try:
        whole = await relay.forward(upstream(emu), "/v1/completions", body, ctx())
        events = await collect(await relay.forward(upstream(emu), "/v1/completions", {**body, "stream": True}, ctx()))
    finally:
        await relay.aclose()
    assert isinstance(whole, Completion) and isinstance(whole.body, bytes)
    assert orjson.loads(whole.body)["choices"][0]["text"] == "tok0 tok1 tok2"
    assert counts(whole.usage) == (2, 3)
    assert sum(e.has_content for e in events) == 3
    assert [counts(e.usage) for e in events if e.usage] == [(2, 3)]


async def test_non_streaming_body_is_passed_through_untouched(emu: RunningEmulator) -> None:
    relay = Relay(emu.style)
    try:
        result = await relay.forward(upstream(emu), CHAT, PROMPT, ctx())
    finally:
        await relay.aclose()
    assert isinstance(result, Completion) and isinstance(result.body, bytes)
    assert orjson.loads(result.body)["choices"][0]["message"]["content"] == "tok0 tok1 tok2 tok3 tok4"
    assert counts(result.usage) == (3, 5)


async def test_bad_request_is_the_clients_error_in_openai_shape(emu: RunningEmulator) -> None:
    relay = Relay(emu.style)
    try:
        with pytest.raises(ClientRequestError) as info:
            await relay.forward(upstream(emu), CHAT, {**PROMPT, "max_tokens": -1}, ctx())
        with pytest.raises(ClientRequestError) as streamed:
            await relay.forward(upstream(emu), CHAT, {**PROMPT, "max_tokens": -1, "stream": True}, ctx())
    finally:
        await relay.aclose()
    for exc in (info.value, streamed.value):
        assert exc.status == 400
        assert "max_tokens must be a non-negative integer" in exc.message


async def test_wrong_engine_key_is_the_gateways_problem(emu: RunningEmulator) -> None:
    relay = Relay(emu.style)
    try:
        with pytest.raises(EngineError) as info:
            await relay.forward(upstream(emu, key="wrong"), CHAT, PROMPT, ctx())
    finally:
        await relay.aclose()
    assert info.value.status == 502 and info.value.code == "upstream_auth"


@pytest.mark.parametrize("style", STYLES)
async def test_midstream_engine_error_ends_the_stream_with_an_openai_error(style: str) -> None:
    with running_emulator(style, "--tokens", "6", "--error-after-tokens", "2") as emu:
        relay = Relay(style)
        try:
            events = await collect(await relay.forward(Upstream(emu.url), CHAT, {**PROMPT, "stream": True}, ctx()))
        finally:
            await relay.aclose()
    assert sum(e.has_content for e in events) == 2
    assert events[-1].is_error and [e.is_error for e in events].count(True) == 1
    error = orjson.loads(events[-1].data)["error"]
    assert error["message"] == "injected generation error" and error["type"] == "server_error"


FAULTS = {
    "crash": (("--crash-after-tokens", "2"), "engine_disconnected"),
    "stall": (("--stall-after-tokens", "2"), "upstream_timeout"),
    "malformed": (("--malformed-after-tokens", "2"), "upstream_malformed"),
}


@pytest.mark.parametrize("style", ["llamacpp", "tabby", "trtllm"])
@pytest.mark.parametrize("fault", sorted(FAULTS))
async def test_stream_faults_end_with_one_error_event_never_a_hang(style: str, fault: str) -> None:
    flags, code = FAULTS[fault]
    with running_emulator(style, "--tokens", "6", *flags) as emu:
        relay = Relay(style, Timeouts(idle=0.5))
        try:
            events = await collect(await relay.forward(Upstream(emu.url), CHAT, {**PROMPT, "stream": True}, ctx()))
        finally:
            await relay.aclose()
    assert sum(e.has_content for e in events) == 2
    assert events[-1].is_error
    assert orjson.loads(events[-1].data)["error"]["code"] == code


@pytest.mark.parametrize(("timeouts", "says"), [
    (Timeouts(first_byte=0.3), "sent no response within"),  # no headers in time
    (Timeouts(first_byte=10.0, total=0.3), "did not finish within"),  # the whole call's deadline comes first
])
async def test_a_slow_answer_is_504_upstream_timeout_by_the_first_deadline_to_pass(timeouts: Timeouts, says: str) -> None:
    with running_emulator("vllm", "--tokens", "2", "--ttft-ms", "1500") as emu:
        relay = Relay("vllm", timeouts)
        try:
            with pytest.raises(EngineError) as info:
                await relay.forward(Upstream(emu.url), CHAT, PROMPT, ctx())
            assert info.value.status == 504 and info.value.code == "upstream_timeout" and says in info.value.message
            events = await collect(await relay.forward(Upstream(emu.url), CHAT, {**PROMPT, "stream": True}, ctx()))
        finally:
            await relay.aclose()
    if timeouts.first_byte < 1:  # the stream's headers come at once; its first event is late
        assert len(events) == 1 and orjson.loads(events[0].data)["error"]["code"] == "upstream_timeout"


@pytest.mark.parametrize(("status", "mapped", "cls"), [(500, 502, EngineError), (503, 503, EngineError),
                                                       (429, 429, ClientRequestError), (404, 404, ClientRequestError)])
async def test_engine_status_mapping(status: int, mapped: int, cls: type[Exception]) -> None:
    with running_emulator("sglang", "--fail-status", str(status)) as emu:
        relay = Relay("sglang")
        try:
            with pytest.raises(cls) as info:
                await relay.forward(Upstream(emu.url), CHAT, {**PROMPT, "stream": True}, ctx())
        finally:
            await relay.aclose()
    assert info.value.status == mapped  # type: ignore[attr-defined]
    assert f"injected failure (status {status})" in info.value.message  # type: ignore[attr-defined]


async def test_unreachable_engine_is_503() -> None:
    relay = Relay("nobody", Timeouts(connect=2.0))
    try:
        with pytest.raises(EngineError) as info:
            await relay.forward(Upstream(f"http://127.0.0.1:{free_port()}"), CHAT, PROMPT, ctx())
    finally:
        await relay.aclose()
    assert info.value.status == 503 and info.value.code == "engine_unreachable"


async def test_events_arrive_as_the_engine_sends_them() -> None:
    itl = 0.1
    with running_emulator("vllm", "--tokens", "6", "--itl-ms", str(itl * 1000)) as emu:
        relay = Relay("vllm")
        arrivals: list[float] = []
        try:
            stream = await relay.forward(Upstream(emu.url), CHAT, {**PROMPT, "stream": True}, ctx())
            async for event in stream:  # type: ignore[union-attr]
                if event.has_content:
                    arrivals.append(time.perf_counter())
        finally:
            await relay.aclose()
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert len(gaps) == 5
    # buffered or coalesced events would arrive together; each must come about one itl apart
    assert min(gaps) > itl * 0.5, gaps


async def test_closing_the_stream_cancels_the_engine_request() -> None:
    with running_emulator("llamacpp", "--tokens", "500", "--itl-ms", "20", "--parallel", "1") as emu:
        relay = Relay("llamacpp")
        try:
            stream = await relay.forward(Upstream(emu.url), CHAT, {**PROMPT, "stream": True}, ctx())
            seen = 0
            async for event in stream:  # type: ignore[union-attr]
                seen += event.has_content
                if seen == 3:
                    break
            async with httpx.AsyncClient() as http:
                assert any(s["is_processing"] for s in (await http.get(f"{emu.url}/slots")).json())
                await stream.aclose()  # type: ignore[union-attr]
                deadline = time.monotonic() + 10
                while any(s["is_processing"] for s in (await http.get(f"{emu.url}/slots")).json()):
                    assert time.monotonic() < deadline, "the engine kept generating for a closed stream"
                    await asyncio.sleep(0.05)
        finally:
            await relay.aclose()


async def test_engine_that_closes_kept_alive_connections_after_each_stream() -> None:
    """llama-server closes the connection after a stream while advertising keep-alive."""
    with running_emulator("llamacpp", "--tokens", "3", "--close-after-stream") as emu:
        relay = Relay("llamacpp")
        try:
            for _ in range(30):
                events = await collect(await relay.forward(Upstream(emu.url), CHAT, {**PROMPT, "stream": True}, ctx()))
                assert sum(e.has_content for e in events) == 3 and not events[-1].is_error
                whole = await relay.forward(Upstream(emu.url), CHAT, PROMPT, ctx())
                assert isinstance(whole, Completion)
        finally:
            await relay.aclose()
