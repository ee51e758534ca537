"""Clients that misbehave at the HTTP level, against a real gateway process: slow or unfinished
headers and bodies time out (408 or a closed connection), a connection cap holds, an aborted
upload is the client's doing (499, one log line), and what the gateway echoes or shows is bounded."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.emulators.fixture import RunningEmulator, running_emulator
from tests.gateway_process import RunningGateway, gateway

pytestmark = pytest.mark.integration
CAP = 12


@pytest.fixture(scope="module")
def upstream() -> Iterator[RunningEmulator]:
    with running_emulator("vllm", "--tokens", "3") as emu:
        yield emu


@pytest.fixture(scope="module")
def gw(upstream: RunningEmulator) -> Iterator[RunningGateway]:
    config = ("header_timeout_seconds: 1\nbody_timeout_seconds: 1\n"
              f"max_connections: {CAP}\napi_keys: [operator-key]\n"
              "models:\n  - source: remote\n    name: relayed\n    engine: openai\n"
              f"    options: {{base_url: \"{upstream.url}\", upstream_model: emulated-model}}\n")
    with gateway(config_yaml=config) as running:
        yield running


AUTH = {"Authorization": "Bearer operator-key"}


def connect(gw: RunningGateway) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", gw.port), timeout=60)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (the socket timeout bounds it)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def chat_ok(gw: RunningGateway) -> httpx.Response:
    body = {"model": "relayed", "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(gw.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=30)


def test_unfinished_headers_get_408_and_a_closed_connection(gw: RunningGateway) -> None:
    with connect(gw) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
        reply = read_until_closed(sock)
    assert reply.startswith(b"HTTP/1.1 408 ") and b'"code":"request_timeout"' in reply


def test_headers_dribbled_byte_by_byte_still_time_out(gw: RunningGateway) -> None:
    """The keep-alive timer stops at the first byte; the header deadline does not."""
    with connect(gw) as sock:
        request = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 400
        sent = 0
        closed = False
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                sock.sendall(request[sent:sent + 1])
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            sent += 1
            time.sleep(0.05)
            if sent == len(request):
                break
        if not closed:
            closed = read_until_closed(sock).startswith(b"HTTP/1.1 408")
    assert closed and sent < len(request), "a client that dribbles headers kept its connection"


def test_unfinished_body_gets_408(gw: RunningGateway) -> None:
    with connect(gw) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer operator-key\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\": ")
        reply = read_until_closed(sock)
    assert reply.startswith(b"HTTP/1.1 408 ") and b'"code":"request_timeout"' in reply


def test_many_slow_connections_are_closed_and_others_are_served(gw: RunningGateway) -> None:
    slow = [connect(gw) for _ in range(CAP)]
    try:
        for sock in slow:
            sock.sendall(b"GET /health HTTP/1.1\r\n")
        # the cap is reached: a new client is refused (503), not left hanging
        refused = chat_ok(gw)
        assert refused.status_code == 503
        for sock in slow:  # each slow connection is answered and closed
            assert read_until_closed(sock).startswith(b"HTTP/1.1 408")
    finally:
        for sock in slow:
            sock.close()
    assert chat_ok(gw).status_code == 200


def test_aborted_upload_is_the_clients_doing(gw: RunningGateway) -> None:
    with connect(gw) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer operator-key\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{\"model\": \"relayed\", ")
    deadline = time.monotonic() + 30
    while "client disconnected while sending the request body" not in gw.log():
        assert time.monotonic() < deadline, "the aborted upload was not noticed"
        time.sleep(0.1)
    metrics = gw.metrics()
    assert 'route="/v1/chat/completions",status="499"' in metrics
    assert 'route="/v1/chat/completions",status="500"' not in metrics
    assert "Exception in ASGI application" not in gw.log() and "Traceback" not in gw.log()


def test_unknown_model_404_is_bounded_and_lists_the_served_models(gw: RunningGateway) -> None:
    name = "m" * 1_000_000
    body = {"model": name, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(gw.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    assert r.status_code == 404 and len(r.content) < 1000
    error = r.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert "served here: relayed" in error["message"]
