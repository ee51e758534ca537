"""Which requests a resume cannot change, the body that resumes one, and the splice of its segments."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from adapters.base import StreamEvent, Usage
from gateway.preemption import Splice, resumable, resume_body

CHAT: dict[str, Any] = {"model": "m", "stream": True, "max_tokens": 40, "messages": [{"role": "user", "content": "hi"}]}
COMPLETION: dict[str, Any] = {"model": "m", "stream": True, "max_tokens": 40, "prompt": "Once"}


@pytest.mark.parametrize(("operation", "body", "ok"), [
    ("chat", CHAT, True),
    ("completions", COMPLETION, True),
    ("chat", {**CHAT, "temperature": 0.7, "top_p": 0.9, "ignore_eos": True, "logprobs": False}, True),
    ("chat", {**CHAT, "presence_penalty": 0}, True),
    ("chat", {**CHAT, "stream": False}, False),          # nothing to splice into
    ("embeddings", {**CHAT}, False),
    ("responses", {**CHAT}, False),
    ("chat", {**CHAT, "n": 2}, False),
    ("chat", {**CHAT, "tools": [{"type": "function"}]}, False),   # a tool call's parser starts over
    ("chat", {**CHAT, "response_format": {"type": "json_object"}}, False),  # so does a grammar
    ("chat", {**CHAT, "seed": 7}, False),                 # a seeded sample would differ
    ("chat", {**CHAT, "logprobs": True}, False),
    ("chat", {**CHAT, "stop": ["\n"]}, False),            # one could span the cut
    ("chat", {**CHAT, "frequency_penalty": 0.5}, False),  # counts output tokens only
    ("chat", {**CHAT, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "A"}]}, False),
    ("chat", {**CHAT, "continue_final_message": True}, False),
    ("completions", {**COMPLETION, "prompt": [1, 2, 3]}, False),
    ("completions", {**COMPLETION, "prompt": ["a", "b"]}, False),
    ("completions", {**COMPLETION, "echo": True}, False),
])
def test_resumable(operation: Any, body: dict[str, Any], ok: bool) -> None:
    assert resumable(operation, body) is ok


def test_a_chat_resumes_as_a_continued_assistant_message_with_what_is_left() -> None:
    body = {**CHAT, "max_completion_tokens": 30, "min_tokens": 5}
    out = resume_body("chat", body, "Once upon", 2)
    assert out["messages"] == [*CHAT["messages"], {"role": "assistant", "content": "Once upon"}]
    assert (out["continue_final_message"], out["add_generation_prompt"]) == (True, False)
    assert (out["max_tokens"], out["max_completion_tokens"], out["min_tokens"]) == (38, 28, 3)
    assert body["messages"] == CHAT["messages"] and "continue_final_message" not in body  # the client's is untouched


def test_a_completion_resumes_from_its_prompt_and_text() -> None:
    out = resume_body("completions", COMPLETION, " upon a", 2)
    assert out["prompt"] == "Once upon a" and out["max_tokens"] == 38 and "messages" not in out


def test_max_tokens_never_reaches_zero_and_unset_stays_unset() -> None:
    assert resume_body("chat", {**CHAT, "max_tokens": 3}, "a b c", 3)["max_tokens"] == 1
    assert "max_tokens" not in resume_body("chat", {k: v for k, v in CHAT.items() if k != "max_tokens"}, "a", 1)


def chunk(content: str | None = None, role: bool = False, finish: str | None = None, cid: str = "c1",
          created: int = 1, **extra: Any) -> StreamEvent:
    delta: dict[str, Any] = {"role": "assistant"} if role else {}
    if content is not None:
        delta["content"] = content
    data = {"id": cid, "created": created, "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta | extra, "finish_reason": finish}]}
    return StreamEvent(orjson.dumps(data), has_content=bool(content), finish_reason=finish)


def test_the_first_segment_passes_through_and_is_noted() -> None:
    splice = Splice("chat")
    events = [chunk(role=True, content=""), chunk("Once"), chunk(" upon")]
    assert [splice.take(e) for e in events] == events
    assert (splice.text, splice.produced, splice.can_resume) == ("Once upon", 2, True)


def test_a_resumed_segment_becomes_the_same_response() -> None:
    splice = Splice("chat")
    for e in (chunk(role=True, content=""), chunk("Once"), chunk(" upon")):
        splice.take(e)
    splice.resumed()
    assert splice.take(chunk(role=True, content="", cid="c2", created=9)) is None  # a second role announcement
    out = splice.take(chunk(" a", role=True, cid="c2", created=9))
    assert out is not None and orjson.loads(out.data)["id"] == "c1" and orjson.loads(out.data)["created"] == 1
    assert orjson.loads(out.data)["choices"][0]["delta"] == {"content": " a"}
    last = splice.take(chunk(finish="length", cid="c2", created=9))
    assert last is not None and orjson.loads(last.data)["choices"][0]["finish_reason"] == "length"
    assert splice.finished and not splice.can_resume


def test_usage_is_the_one_request_the_client_made() -> None:
    splice = Splice("chat")
    for e in (chunk("a"), chunk(" b"), chunk(" c")):
        splice.take(e)
    splice.resumed()
    usage = {"prompt_tokens": 23, "completion_tokens": 37, "total_tokens": 60}
    data = orjson.dumps({"id": "c2", "created": 9, "choices": [], "usage": usage})
    out = splice.take(StreamEvent(data, usage=Usage(23, 37, cached_tokens=22)))
    assert out is not None and out.usage == Usage(20, 40, 20)  # the 3 tokens given back count as output again
    assert orjson.loads(out.data)["usage"] == {"prompt_tokens": 20, "completion_tokens": 40, "total_tokens": 60}
    observed = splice.take(StreamEvent(b"", usage=Usage(23, 37)))  # a usage event only observed, never sent
    assert observed is not None and observed.usage == Usage(20, 40)


@pytest.mark.parametrize("extra", [{"reasoning_content": "hmm"}, {"tool_calls": [{"index": 0}]}])
def test_what_text_cannot_carry_makes_a_stream_unresumable(extra: dict[str, Any]) -> None:
    splice = Splice("chat")
    splice.take(chunk("a"))
    splice.take(chunk(None, **extra))
    assert not splice.can_resume


def test_completions_text_is_noted_and_rewritten() -> None:
    splice = Splice("completions")
    splice.take(StreamEvent(orjson.dumps({"id": "x", "created": 1, "choices": [{"text": "Once", "finish_reason": None}]})))
    splice.resumed()
    out = splice.take(StreamEvent(orjson.dumps({"id": "y", "created": 2, "choices": [{"text": " upon", "finish_reason": None}]})))
    assert out is not None and orjson.loads(out.data)["id"] == "x" and splice.text == "Once upon"


def test_error_events_pass_unchanged() -> None:
    splice = Splice("chat")
    splice.resumed()
    error = StreamEvent(b'{"error":{"message":"x"}}', is_error=True)
    assert splice.take(error) is error
