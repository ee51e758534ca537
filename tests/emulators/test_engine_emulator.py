"""Each emulator style reproduces its engine's documented quirks (raw HTTP, real processes)."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from tests.emulators.fixture import RunningEmulator, running_emulator
from tests.emulators.styles import STYLES

pytestmark = pytest.mark.integration

CHAT = {"model": "emulated-model", "messages": [{"role": "user", "content": "one two three"}]}


def stream_raw(emu: RunningEmulator, body: dict[str, Any], path: str = "/v1/chat/completions",
               headers: dict[str, str] | None = None) -> bytes:
    with httpx.stream("POST", emu.url + path, json=body, headers=headers, timeout=30) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        return r.read()


def events(raw: bytes) -> list[str]:
    """SSE data payloads in order (comments dropped), for either \\n\\n or \\r\\n\\r\\n framing."""
    text = raw.decode().replace("\r\n", "\n")
    out = []
    for block in text.split("\n\n"):
        for line in block.split("\n"):
            if line.startswith("data: "):
                out.append(line[len("data: "):].rstrip(" "))
    return out


def content_of(payloads: list[str]) -> str:
    text = ""
    for p in payloads:
        if p == "[DONE]":
            continue
        obj = json.loads(p)
        for c in obj.get("choices", []):
            text += (c.get("delta") or {}).get("content") or c.get("text") or ""
    return text


def wait_until(predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


@pytest.mark.parametrize("style", sorted(STYLES))
def test_every_style_streams_and_counts_usage(style: str) -> None:
    with running_emulator(style, "--tokens", "5") as emu:
        models = httpx.get(emu.url + "/v1/models").json()
        assert [m["id"] for m in models["data"]] == ["emulated-model"]
        payloads = events(stream_raw(emu, {**CHAT, "stream": True, "max_tokens": 3,
                                           "stream_options": {"include_usage": True}}))
        assert payloads[-1] == "[DONE]"
        assert content_of(payloads) == "tok0 tok1 tok2"
        last = json.loads(payloads[-2])
        assert last["choices"] == []
        assert last["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
        # without include_usage there is no usage chunk
        plain = events(stream_raw(emu, {**CHAT, "stream": True}))
        assert all("usage" not in json.loads(p) for p in plain if p != "[DONE]")
        assert content_of(plain) == "tok0 tok1 tok2 tok3 tok4"
        whole = httpx.post(emu.url + "/v1/chat/completions", json={**CHAT, "max_tokens": 2}).json()
        assert whole["choices"][0]["message"]["content"] == "tok0 tok1"
        assert whole["choices"][0]["finish_reason"] == "length"
        assert whole["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
        comp = httpx.post(emu.url + "/v1/completions", json={"prompt": "a b", "max_tokens": 10}).json()
        assert comp["choices"][0]["text"] == "tok0 tok1 tok2 tok3 tok4"
        assert comp["choices"][0]["finish_reason"] == "stop"
        assert comp["usage"]["prompt_tokens"] == 2
        comp_stream = events(stream_raw(emu, {"prompt": "a", "stream": True, "max_tokens": 2,
                                              "stream_options": {"include_usage": True}}, "/v1/completions"))
        assert content_of(comp_stream) == "tok0 tok1"
        assert json.loads(comp_stream[-2])["usage"]["completion_tokens"] == 2


def test_ignore_eos_and_min_tokens_hold_the_length() -> None:
    with running_emulator("vllm", "--tokens", "4") as emu:
        r = httpx.post(emu.url + "/v1/chat/completions", json={**CHAT, "max_tokens": 9, "ignore_eos": True}).json()
        assert r["usage"]["completion_tokens"] == 9
        r = httpx.post(emu.url + "/v1/chat/completions", json={**CHAT, "max_tokens": 9, "min_tokens": 6}).json()
        assert r["usage"]["completion_tokens"] == 6


def test_embeddings_are_deterministic() -> None:
    with running_emulator("vllm", "--embedding-dim", "4") as emu:
        a = httpx.post(emu.url + "/v1/embeddings", json={"input": ["x y", "z"]}).json()
        b = httpx.post(emu.url + "/v1/embeddings", json={"input": "x y"}).json()
        assert len(a["data"]) == 2 and len(a["data"][0]["embedding"]) == 4
        assert a["data"][0]["embedding"] == b["data"][0]["embedding"]
        assert a["usage"]["prompt_tokens"] == 3


def test_llamacpp_loading_phase_then_health_and_slots() -> None:
    with running_emulator("llamacpp", "--startup-delay", "1.5", "--metrics", "--parallel", "2",
                          wait_ready=False) as emu:
        wait_until(lambda: httpx.get(emu.url + "/v1/models").status_code == 200)
        loading = httpx.post(emu.url + "/v1/chat/completions", json=CHAT)
        if loading.status_code == 503:  # still inside the loading window
            assert loading.json() == {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
            assert httpx.get(emu.url + "/health").status_code == 503
        emu.wait_ready()
        health = httpx.get(emu.url + "/health")
        assert health.status_code == 200 and health.json() == {"status": "ok"}
        assert [s["id"] for s in httpx.get(emu.url + "/slots").json()] == [0, 1]
        models = httpx.get(emu.url + "/v1/models").json()
        assert models["data"][0]["owned_by"] == "llamacpp" and "n_ctx_train" in models["data"][0]["meta"]
        httpx.post(emu.url + "/v1/chat/completions", json={**CHAT, "max_tokens": 2})
        metrics = httpx.get(emu.url + "/metrics").text
        assert "llamacpp:tokens_predicted_total 2.0" in metrics
        assert "llamacpp:prompt_tokens_total 3.0" in metrics


def test_llamacpp_loading_answers_503_on_every_route_but_models() -> None:
    with running_emulator("llamacpp", "--startup-delay", "30", wait_ready=False) as emu:
        wait_until(lambda: httpx.get(emu.url + "/v1/models").status_code == 200)
        for path in ("/health", "/slots"):
            assert httpx.get(emu.url + path).status_code == 503
        r = httpx.post(emu.url + "/v1/chat/completions", json=CHAT)
        assert r.status_code == 503
        assert r.json() == {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}


def test_llamacpp_errors_metrics_flag_and_midstream_error() -> None:
    with running_emulator("llamacpp", "--error-after-tokens", "2", "--api-key", "k") as emu:
        r = httpx.post(emu.url + "/v1/chat/completions", json=CHAT)
        assert r.status_code == 401
        assert r.json() == {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}
        assert httpx.get(emu.url + "/health").status_code == 200  # public
        auth = {"Authorization": "Bearer k"}
        bad = httpx.post(emu.url + "/v1/chat/completions", json={"messages": []}, headers=auth)
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
        assert httpx.get(emu.url + "/metrics", headers=auth).status_code == 501
        payloads = events(stream_raw(emu, {**CHAT, "stream": True}, headers=auth))
        assert payloads[-1] != "[DONE]"
        assert json.loads(payloads[-1]) == {"error": {"code": 500, "message": "injected generation error",
                                                      "type": "server_error"}}
        assert content_of(payloads[:-1]) == "tok0 tok1"


def test_llamacpp_final_chunk_has_timings_and_role_first() -> None:
    with running_emulator("llamacpp") as emu:
        payloads = [json.loads(p) for p in events(stream_raw(emu, {**CHAT, "stream": True, "max_tokens": 2}))[:-1]]
        assert payloads[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
        assert payloads[-1]["timings"]["predicted_n"] == 2


def test_vllm_port_closed_until_ready_and_first_delta() -> None:
    with running_emulator("vllm", "--startup-delay", "1.0", wait_ready=False) as emu:
        with pytest.raises(httpx.ConnectError):
            httpx.get(emu.url + "/health")
        emu.wait_ready()
        assert httpx.get(emu.url + "/health").status_code == 200
        payloads = events(stream_raw(emu, {**CHAT, "stream": True, "max_tokens": 1}))
        assert json.loads(payloads[0])["choices"][0]["delta"] == {"role": "assistant", "content": ""}


def test_vllm_errors_auth_scope_and_metrics() -> None:
    with running_emulator("vllm", "--api-key", "k", "--error-after-tokens", "1") as emu:
        assert httpx.get(emu.url + "/v1/models").json() == {"error": "Unauthorized"}
        assert httpx.get(emu.url + "/health").status_code == 200
        auth = {"Authorization": "Bearer k"}
        r = httpx.post(emu.url + "/v1/chat/completions", json={**CHAT, "max_tokens": "x"}, headers=auth)
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "max_tokens" and r.json()["error"]["type"] == "BadRequestError"
        r = httpx.post(emu.url + "/v1/chat/completions", json={**CHAT, "model": "nope"}, headers=auth)
        assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"
        payloads = events(stream_raw(emu, {**CHAT, "stream": True}, headers=auth))
        assert payloads[-1] == "[DONE]" and "error" in json.loads(payloads[-2])
        assert "vllm:num_requests_running" in httpx.get(emu.url + "/metrics").text


def test_sglang_warmup_flat_errors_and_generation_waits() -> None:
    with running_emulator("sglang", "--startup-delay", "1.0", "--fail-status", "400", wait_ready=False) as emu:
        wait_until(lambda: httpx.get(emu.url + "/v1/models").status_code == 200)
        emu.wait_ready()
        assert httpx.get(emu.url + "/health").status_code == 200
        r = httpx.post(emu.url + "/v1/chat/completions", json=CHAT)
        assert r.status_code == 400
        assert r.json() == {"object": "error", "message": "injected failure (status 400)",
                            "type": "BadRequestError", "param": None, "code": 400}
        assert "sglang:num_running_reqs" in httpx.get(emu.url + "/metrics").text


def test_sglang_health_503_during_warmup() -> None:
    with running_emulator("sglang", "--startup-delay", "30", wait_ready=False) as emu:
        wait_until(lambda: httpx.get(emu.url + "/v1/models").status_code == 200)
        assert httpx.get(emu.url + "/health").status_code == 503
        assert httpx.get(emu.url + "/health_generate").status_code == 503


def test_trtllm_first_chunk_space_and_metrics_split() -> None:
    with running_emulator("trtllm", "--fail-status", "500") as emu:
        r = httpx.post(emu.url + "/v1/chat/completions", json=CHAT)
        assert r.json() == {"message": "injected failure (status 500)", "type": "InternalServerError", "code": 500}
        assert isinstance(httpx.get(emu.url + "/metrics").json(), list)
        assert "trtllm_num_requests_running" in httpx.get(emu.url + "/prometheus/metrics").text
    with running_emulator("trtllm") as emu:
        raw = stream_raw(emu, {**CHAT, "stream": True, "max_tokens": 2})
        first, rest = raw.split(b"\n\n", 1)
        assert first.endswith(b"} ") and b"} \n\n" not in rest


def test_tabby_framing_auth_and_errors() -> None:
    with running_emulator("tabby", "--api-key", "k") as emu:
        r = httpx.post(emu.url + "/v1/chat/completions", json=CHAT)
        assert r.status_code == 401 and r.json() == {"detail": "Invalid API key"}
        raw = stream_raw(emu, {**CHAT, "stream": True, "max_tokens": 2}, headers={"x-api-key": "k"})
        assert raw.startswith(b": ping") and raw.endswith(b"data: [DONE]\r\n\r\n")
        assert b"\n\n" not in raw.replace(b"\r\n\r\n", b"")
        ok = httpx.post(emu.url + "/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer k"})
        assert ok.status_code == 200
        assert httpx.get(emu.url + "/health").json() == {"status": "healthy", "issues": []}
        bad = httpx.post(emu.url + "/v1/chat/completions", json={**CHAT, "max_tokens": 5000},
                         headers={"x-api-key": "k"})
        assert bad.status_code == 400 and bad.json()["detail"]["code"] == "context_length_exceeded"


def test_tabby_port_closed_until_ready() -> None:
    with running_emulator("tabby", "--startup-delay", "30", wait_ready=False) as emu:
        time.sleep(0.5)
        with pytest.raises(httpx.ConnectError):
            httpx.get(emu.url + "/health")


def test_mlx_health_ok_while_loading_keepalive_and_role_repeat() -> None:
    with running_emulator("mlx", "--startup-delay", "1.0", "--fail-status", "404", wait_ready=False) as emu:
        wait_until(lambda: httpx.get(emu.url + "/health").status_code == 200)
        assert httpx.get(emu.url + "/health").json() == {"status": "ok"}
        emu.wait_ready()
        r = httpx.post(emu.url + "/v1/chat/completions", json=CHAT)
        assert r.status_code == 404 and r.json() == {"error": "injected failure (status 404)"}
    with running_emulator("mlx") as emu:
        raw = stream_raw(emu, {**CHAT, "stream": True, "max_tokens": 2, "stream_options": {"include_usage": True}})
        assert raw.startswith(b": keepalive 1/3\n\n: keepalive 3/3\n\n")
        payloads = [json.loads(p) for p in events(raw)[:-1]]
        for p in payloads[:-1]:
            assert p["choices"][0]["delta"]["role"] == "assistant"
        assert payloads[-1]["object"] == "chat.completion" and payloads[-1]["choices"] == []


def test_mlx_generation_waits_for_the_load() -> None:
    with running_emulator("mlx", "--startup-delay", "1.0", wait_ready=False) as emu:
        wait_until(lambda: httpx.get(emu.url + "/health").status_code == 200)
        r = httpx.post(emu.url + "/v1/chat/completions", json=CHAT, timeout=30)
        assert r.status_code == 200
        emu.wait_ready(timeout=5)


def test_dynamo_ready_only_when_model_listed() -> None:
    with running_emulator("dynamo", "--startup-delay", "30", wait_ready=False) as emu:
        wait_until(lambda: httpx.get(emu.url + "/live").status_code == 200)
        assert httpx.get(emu.url + "/health").status_code == 200
        assert httpx.get(emu.url + "/v1/models").json()["data"] == []
        r = httpx.post(emu.url + "/v1/chat/completions", json=CHAT)
        assert r.status_code == 404 and r.content == b""


def test_dynamo_flat_errors_and_metrics() -> None:
    with running_emulator("dynamo") as emu:
        r = httpx.post(emu.url + "/v1/chat/completions", json={**CHAT, "model": "other"})
        assert r.status_code == 404
        assert r.json() == {"message": "The model `other` does not exist.", "type": "Not Found", "code": 404}
        httpx.post(emu.url + "/v1/chat/completions", json={**CHAT, "max_tokens": 4})
        metrics = httpx.get(emu.url + "/metrics").text
        assert 'dynamo_frontend_output_tokens_total{model="emulated-model"} 4.0' in metrics
        assert "dynamo_frontend_model_ready" in metrics


def test_crash_after_tokens_kills_the_process_mid_stream() -> None:
    with running_emulator("vllm", "--crash-after-tokens", "2") as emu:
        received = b""
        with pytest.raises(httpx.HTTPError):
            with httpx.stream("POST", emu.url + "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
                for part in r.iter_raw():
                    received += part
        assert b"tok1" in received and b"tok2" not in received
        emu.process.wait(timeout=10)
        assert emu.process.returncode == 1


def test_stall_after_tokens_keeps_the_connection_open() -> None:
    with running_emulator("vllm", "--stall-after-tokens", "1") as emu:
        received = b""
        with pytest.raises(httpx.ReadTimeout):
            with httpx.stream("POST", emu.url + "/v1/chat/completions", json={**CHAT, "stream": True},
                              timeout=httpx.Timeout(5.0, read=1.0)) as r:
                for part in r.iter_raw():
                    received += part
        assert b"tok0" in received and b"tok1" not in received
        assert emu.alive()


def test_malformed_after_tokens_sends_broken_json() -> None:
    with running_emulator("sglang", "--malformed-after-tokens", "1") as emu:
        payloads = events(stream_raw(emu, {**CHAT, "stream": True, "max_tokens": 3}))
        broken = [p for p in payloads if p != "[DONE]" and not p.endswith("}")]
        assert len(broken) == 1
        with pytest.raises(json.JSONDecodeError):
            json.loads(broken[0])


def test_error_rate_is_seeded_and_in_the_style_shape() -> None:
    def statuses(seed: str) -> list[int]:
        with running_emulator("llamacpp", "--error-rate", "0.5", "--seed", seed) as emu:
            out = []
            for _ in range(40):
                r = httpx.post(emu.url + "/v1/chat/completions", json={**CHAT, "max_tokens": 1})
                if r.status_code == 500:
                    assert r.json()["error"]["type"] == "server_error"
                out.append(r.status_code)
            return out

    first = statuses("7")
    assert first == statuses("7")
    assert 5 <= first.count(500) <= 35 and set(first) == {200, 500}


def test_ttft_and_itl_are_applied() -> None:
    with running_emulator("vllm", "--ttft-ms", "300", "--itl-ms", "100", "--tokens", "4") as emu:
        stamps: list[float] = []
        start = time.perf_counter()
        with httpx.stream("POST", emu.url + "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
            for line in r.iter_lines():
                if '"content":"' in line and '"content":""' not in line:
                    stamps.append(time.perf_counter() - start)
        assert len(stamps) == 4
        assert stamps[0] >= 0.3
        assert stamps[3] - stamps[0] >= 0.3 - 0.01  # three gaps of >= 100 ms (sleep never returns early)


def test_llamacpp_real_build_answers_503_on_models_too() -> None:
    with running_emulator("llamacpp", "--startup-delay", "30", "--models-503-while-loading", wait_ready=False) as emu:
        wait_until(lambda: httpx.get(emu.url + "/health").status_code == 503)
        r = httpx.get(emu.url + "/v1/models")
        assert r.status_code == 503 and r.json()["error"]["message"] == "Loading model"


def test_continue_final_message_resumes_a_cut_stream() -> None:
    resumed = {"model": "emulated-model", "continue_final_message": True, "add_generation_prompt": False,
               "messages": [*CHAT["messages"], {"role": "assistant", "content": "tok0 tok1 tok2"}]}
    with running_emulator("vllm", "--tokens", "16") as emu:
        payloads = events(stream_raw(emu, {**resumed, "stream": True, "max_tokens": 3,
                                           "stream_options": {"include_usage": True}}))
        assert content_of(payloads) == " tok3 tok4 tok5"
        assert json.loads(payloads[-3])["choices"][0]["finish_reason"] == "length"
        assert json.loads(payloads[-2])["usage"] == {"prompt_tokens": 6, "completion_tokens": 3, "total_tokens": 9}
        parts = {"continue_final_message": True,  # add_generation_prompt left out: taken as false
                 "messages": [*CHAT["messages"],
                              {"role": "assistant", "content": [{"type": "text", "text": "tok0 tok1"}]}]}
        whole = httpx.post(emu.url + "/v1/chat/completions", json={**parts, "max_tokens": 2}).json()
        assert whole["choices"][0]["message"]["content"] == " tok2 tok3"
        both = httpx.post(emu.url + "/v1/chat/completions", json={**resumed, "add_generation_prompt": True})
        assert both.status_code == 400
        assert both.json()["error"]["message"] == \
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
        assert both.json()["error"]["param"] is None
        user_last = httpx.post(emu.url + "/v1/chat/completions", json={**CHAT, "continue_final_message": True})
        assert user_last.status_code == 400 and user_last.json()["error"]["param"] == "messages"


def test_completions_continue_a_prompt_ending_in_emulated_tokens() -> None:
    with running_emulator("sglang", "--tokens", "16") as emu:
        body = {"prompt": "Once upon tok0 tok1 tok2", "max_tokens": 3, "stream": True,
                "stream_options": {"include_usage": True}}
        payloads = events(stream_raw(emu, body, "/v1/completions"))
        assert content_of(payloads) == " tok3 tok4 tok5"
        assert json.loads(payloads[-2])["usage"]["completion_tokens"] == 3
        comp = httpx.post(emu.url + "/v1/completions", json={"prompt": "say tok9x", "max_tokens": 2}).json()
        assert comp["choices"][0]["text"] == "tok0 tok1"
