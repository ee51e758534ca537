from __future__ import annotations

import orjson
import pytest

from adapters.base import ClientRequestError, EngineError, Usage
from adapters.observe import extract_usage, observe
from adapters.openai_http import forward_headers
from adapters.sse import SSEParser
from adapters.upstream_errors import error_exception, normalise_error, stream_failure
from gateway.routing.health import is_failure

CHUNK = b'{"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}'


def feed_all(parser: SSEParser, pieces: list[bytes]) -> list[bytes]:
    out: list[bytes] = []
    for piece in pieces:
        out += parser.feed(piece)
    return out + parser.close()


STREAMS = {
    "lf": b"data: " + CHUNK + b"\n\ndata: [DONE]\n\n",
    "crlf": b"data: " + CHUNK + b"\r\n\r\ndata: [DONE]\r\n\r\n",
    "cr": b"data: " + CHUNK + b"\r\rdata: [DONE]\r\r",
    "trailing_space": b"data: " + CHUNK + b" \n\ndata: [DONE]\n\n",
    "comments_and_fields": b": ping - 2026\r\n\r\nevent: message\nid: 7\ndata: " + CHUNK + b"\n\n: keepalive 1/2\n\ndata: [DONE]\n\n",
    "no_space_after_colon": b"data:" + CHUNK + b"\n\ndata:[DONE]\n\n",
}


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_sse_parser_every_split(name: str) -> None:
    raw = STREAMS[name]
    whole = feed_all(SSEParser(), [raw])
    assert whole == [CHUNK, b"[DONE]"]
    for cut in range(1, len(raw)):
        assert feed_all(SSEParser(), [raw[:cut], raw[cut:]]) == whole, cut
    assert feed_all(SSEParser(), [raw[i:i + 1] for i in range(len(raw))]) == whole


def test_sse_parser_multiline_data_and_unterminated_tail() -> None:
    assert feed_all(SSEParser(), [b"data: a\ndata: b\n\n"]) == [b"a\nb"]
    # an engine that closes without the final blank line still delivers its last event
    assert feed_all(SSEParser(), [b"data: " + CHUNK + b"\n"]) == [CHUNK]
    assert feed_all(SSEParser(), [b": only a comment\n\n"]) == []


def test_sse_parser_yields_each_event_of_one_read() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: 1\n\ndata: 2\n\ndata: 3") == [b"1", b"2"]
    assert parser.feed(b"\n\n") == [b"3"]


ERRORS = [
    # (status, upstream body, expected message, type, param, code)
    (400, {"error": {"code": 400, "message": "bad n_probs", "type": "invalid_request_error"}},
     "bad n_probs", "invalid_request_error", None, None),
    (400, {"error": {"message": "temperature too high", "type": "BadRequestError", "param": "temperature", "code": 400}},
     "temperature too high", "invalid_request_error", "temperature", None),
    (400, {"object": "error", "message": "flat sglang", "type": "BadRequestError", "param": "max_tokens", "code": 400},
     "flat sglang", "invalid_request_error", "max_tokens", None),
    (404, {"message": "no such model", "type": "Not Found", "code": 404}, "no such model", "not_found_error", None, None),
    (404, {"error": "Model not found"}, "Model not found", "not_found_error", None, None),
    (400, {"detail": "Invalid prompt"}, "Invalid prompt", "invalid_request_error", None, None),
    (400, {"detail": {"message": "too long", "code": "context_length_exceeded"}},
     "too long", "invalid_request_error", None, "context_length_exceeded"),
    (422, {"detail": [{"loc": ["body", "messages", 0, "role"], "msg": "field required", "type": "missing"}]},
     "messages.0.role: field required", "invalid_request_error", "messages.0.role", None),
    (404, b"", "Not Found", "not_found_error", None, None),
    (500, b"upstream exploded", "upstream exploded", "server_error", None, None),
    (503, {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}},
     "Loading model", "unavailable_error", None, None),
]


@pytest.mark.parametrize(("status", "body", "message", "etype", "param", "code"), ERRORS)
def test_normalise_error_shapes(status: int, body: object, message: str, etype: str, param: str | None, code: object) -> None:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    assert normalise_error(status, raw) == {"error": {"message": message, "type": etype, "param": param, "code": code}}


def test_error_exception_blames_the_right_side() -> None:
    bad = error_exception(400, b'{"object":"error","message":"m","param":"n","code":400}')
    assert isinstance(bad, ClientRequestError) and (bad.status, bad.param) == (400, "n")
    assert isinstance(error_exception(429, b"{}"), ClientRequestError)
    for status, mapped in ((500, 502), (401, 502), (503, 503), (529, 503), (504, 504), (499, 502)):
        exc = error_exception(status, b'{"error":"x"}')
        assert isinstance(exc, EngineError) and exc.status == mapped, status


# llama-server's own refusals of a request it cannot take (its std::runtime_error answers 500)
REFUSED_INPUTS = [
    (500, "image input is not supported - hint: if this is unexpected, you may need to provide the mmproj"),
    (500, "audio input is not supported - hint: if this is unexpected, you may need to provide the mmproj"),
    (500, "Multimodal data provided, but model does not support multimodal requests."),
    (500, "input (6001 tokens) is too large to process. increase the physical batch size (current batch size: 2048)"),
    (500, "Invalid base64 value"),
    (500, "Cannot use both json_schema and grammar"),
    (500, "\"prompt\" must not be empty"),
    (500, "Unsupported param: echo"),
    (501, "This server does not support embeddings. Start it with `--embeddings`"),
    # issue 32: what llama-server (0c1e570) answers a tools list or a message history it cannot parse
    (500, "Failed to parse tools: [json.exception.type_error.302] type must be string, but is number; tools = [\n  {\n"
          "    \"type\": \"function\",\n    \"function\": {\n      \"name\": 123\n    }\n  }\n]"),
    (500, "Failed to parse tools: Missing tool function: {\"type\":\"function\"}; tools = []"),
    (500, "Failed to parse tools: Unsupported tool type: {\"type\":\"custom\",\"custom\":{\"name\":\"g\"}}; tools = []"),
    (500, "Failed to parse tools: Expected 'tools' to be an array, got \"x\"; tools = \"x\""),
    (500, "Failed to parse messages: [json.exception.type_error.302] type must be string, but is number"),
    (500, "Failed to parse messages: Missing tool call function: {\"id\":\"1\",\"type\":\"function\"}"),
    (500, "Failed to parse tool call arguments as JSON: [json.exception.parse_error.101] parse error at line 1"),
    (500, "While executing CallExpression at line 1, column 77 in source: Error: Jinja Exception: Conversation roles "
          "must alternate user/assistant/user/assistant/..."),  # a template's raise_exception (older builds: 500)
    (500, "Cannot specify grammar with tools"),
    (500, "tools param requires --jinja flag"),
]
ENGINE_FAILURES = [(500, "No available space in KV cache"), (500, "llama_decode failed"), (502, "bad gateway"),
                   (500, "Failed to tokenize prompt"),
                   # about the engine's own output or set-up, not the request: its failure
                   (500, "Invalid diff: tool call mismatch!"), (500, "Failed to parse input at pos 12: <tool_call>{"),
                   (500, "[json.exception.parse_error.101] parse error at line 1, column 2"),
                   (500, "Unknown chat format"), (500, "failed to apply chat template, try using --jinja"),
                   (500, "Server tokens state is too large")]


@pytest.mark.parametrize("status, message", REFUSED_INPUTS)
def test_an_engine_refusing_the_input_is_the_clients_error(status: int, message: str) -> None:
    body = orjson.dumps({"error": {"code": status, "message": message, "type": "server_error"}})
    exc = error_exception(status, body, "llama_server")
    assert isinstance(exc, ClientRequestError) and exc.status == 400, (status, message, exc)
    assert "; tools = " not in exc.message  # llama-server's echo of the whole field is cut
    assert status != 500 or isinstance(stream_failure(body), ClientRequestError)
    assert is_failure(exc) is None  # never a breaker failure


@pytest.mark.parametrize("status, message", ENGINE_FAILURES)
def test_an_engine_failing_stays_the_engines(status: int, message: str) -> None:
    body = orjson.dumps({"error": {"code": status, "message": message, "type": "server_error"}})
    assert isinstance(error_exception(status, body), EngineError)
    assert isinstance(stream_failure(body), EngineError)


def test_forward_headers_strips_hop_by_hop_and_credentials() -> None:
    headers = {
        "Connection": "keep-alive, X-Secret-Hop", "Keep-Alive": "5", "Transfer-Encoding": "chunked",
        "X-Secret-Hop": "1", "Authorization": "Bearer client-key", "Host": "gw", "Content-Length": "9",
        "X-Trace": "abc", "OpenAI-Organization": "org",
    }
    assert forward_headers(headers) == {"X-Trace": "abc", "OpenAI-Organization": "org"}


def test_observe_reads_content_finish_and_usage() -> None:
    ev = observe(CHUNK, drop_usage=True)
    assert ev.data is CHUNK and ev.has_content and ev.finish_reason is None
    role = observe(b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}', True)
    assert not role.has_content
    text = observe(b'{"choices":[{"index":0,"text":"x","finish_reason":"length"}]}', True)
    assert text.has_content and text.finish_reason == "length"
    tool = observe(b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]}}]}', True)
    assert tool.has_content
    usage_chunk = b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}}'
    dropped = observe(usage_chunk, drop_usage=True)
    assert dropped.data == b"" and dropped.usage == Usage(3, 5)
    kept = observe(usage_chunk, drop_usage=False)
    assert kept.data is usage_chunk and kept.usage == Usage(3, 5)


@pytest.mark.parametrize("payload", [
    b'{"error":{"message":"boom","trace":"..."}}',
    b'{"message":"boom","type":"InternalServerError","code":500}',
    b'{"object":"error","message":"boom","type":"x","code":500}',
])
def test_observe_midstream_errors_become_openai_errors(payload: bytes) -> None:
    ev = observe(payload, True)
    assert ev.is_error
    err = orjson.loads(ev.data)["error"]
    assert err["message"] == "boom" and err["type"] == "server_error"


def test_observe_malformed_event_is_an_error() -> None:
    ev = observe(b'{"choices": [{"delta": {"content": "tok', True)
    assert ev.is_error and orjson.loads(ev.data)["error"]["code"] == "upstream_malformed"


def test_extract_usage() -> None:
    body = orjson.dumps({"choices": [{"message": {"content": 'say "usage" {'}}],
                         "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6,
                                   "prompt_tokens_details": {"cached_tokens": 0}}})
    assert extract_usage(body) == Usage(4, 2, cached_tokens=0)
    assert extract_usage(b'{"usage":{"prompt_tokens":7,"total_tokens":7},"data":[]}') == Usage(7, 0)
    llama_server = orjson.dumps({"choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 5},
                                 "timings": {"cache_n": 29, "prompt_n": 1, "prompt_ms": 43.5}})
    assert extract_usage(llama_server) == Usage(30, 5, cached_tokens=29, prefill_seconds=0.0435)
    bogus = b'{"usage":{"prompt_tokens":3,"prompt_tokens_details":{"cached_tokens":true}},"timings":{"prompt_ms":"x"}}'
    assert extract_usage(bogus) == Usage(3, 0)
    assert extract_usage(b'{"choices":[]}') is None
    assert extract_usage(b"not json") is None
    big = orjson.dumps({"object": "list", "data": [{"embedding": [0.125] * 20000}],
                        "usage": {"prompt_tokens": 9, "total_tokens": 9}})
    assert len(big) > 64 * 1024 and extract_usage(big) == Usage(9, 0)
