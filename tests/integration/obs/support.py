"""Helpers shared by the observability integration tests."""

from __future__ import annotations

import subprocess

import httpx

from tests.gateway_process import free_port

__all__ = ["CHAT", "free_port", "send_traffic", "stop"]

CHAT = {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 12, "temperature": 0}


def send_traffic(url: str) -> None:
    """Non-streamed and streamed chats, a completion, a client that leaves mid-stream, an unknown model."""
    with httpx.Client(base_url=url, timeout=120) as client:
        for _ in range(2):
            assert client.post("/v1/chat/completions", json={"model": "default", **CHAT}).status_code == 200
        for _ in range(3):
            body = {"model": "default", **CHAT, "stream": True, "stream_options": {"include_usage": True}}
            with client.stream("POST", "/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                assert r.read().endswith(b"data: [DONE]\n\n")
        assert client.post("/v1/completions", json={"model": "default", "prompt": "Once upon", "max_tokens": 8}).status_code == 200
        with client.stream("POST", "/v1/chat/completions", json={"model": "default", **CHAT, "max_tokens": 200, "stream": True}) as r:
            next(r.iter_bytes())  # first event, then leave: the gateway must count a disconnect
        assert client.post("/v1/chat/completions", json={"model": "no-such-model", **CHAT}).status_code == 404


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
