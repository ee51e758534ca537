"""The answer in the form back into text or calls: whole, cut by the token limit, and streamed piece by piece."""

from __future__ import annotations

import pytest

from adapters.tool_prompt import AnswerStream, Parsed, parse_answer

CALL = '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}'


@pytest.mark.parametrize(("answer", "parsed"), [
    ('{"response": "Hello there"}', Parsed(text="Hello there")),
    ('  {"response" : "caf\\u00e9 \\"x\\"\\n"}', Parsed(text='café "x"\n')),
    ('{"response": "\\ud83d\\ude00"}', Parsed(text="\U0001F600")),
    (CALL, Parsed(calls=[("get_weather", '{"city":"Paris"}')])),
    ('{"tool_calls": [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}]}',
     Parsed(calls=[("a", "{}"), ("b", '{"x":1}')])),
    ('{"tool_call": {"name": "get_weather", "arguments": {"ci', Parsed(calls=[("get_weather", '{"ci')])),  # cut
    ('{"tool_call": {"name": "get_weather", "arguments": ', Parsed(calls=[("get_weather", "")])),
    ('{"response": "cut mid-sent', Parsed(text="cut mid-sent")),
    ('{"response": "cut in an escape \\u00', Parsed(text="cut in an escape \\u00")),
    ("plain words, the form ignored", Parsed(text="plain words, the form ignored")),
    ('{"weather": "sunny"}', Parsed(text='{"weather": "sunny"}')),  # JSON, but neither a reply nor a call
    ('{"tool_call": {"arguments": {}}}', Parsed(text='{"tool_call": {"arguments": {}}}')),  # a call with no name
    ("", Parsed(text="")),
])
def test_parse(answer: str, parsed: Parsed) -> None:
    assert parse_answer(answer) == parsed


@pytest.mark.parametrize("answer", ['{"response": "Hello\\nw\\u00f6rld \\ud83d\\ude00!"}', "no form at all", CALL])
def test_streamed_piece_by_piece_is_the_whole(answer: str) -> None:
    """Fed one character at a time (escapes split anywhere), the text sent equals the whole answer's."""
    stream = AnswerStream()
    sent = "".join(stream.feed(c) for c in answer)
    tail, parsed = stream.finish()
    assert sent + tail == parsed.text == parse_answer(answer).text
    assert parsed.calls == parse_answer(answer).calls


def test_a_reply_streams_before_it_ends() -> None:
    stream = AnswerStream()
    assert stream.feed('{"resp') == ""  # may still become either
    assert stream.feed('onse": "Hel') == "Hel"
    assert stream.feed('lo"}') == "lo"
    assert stream.finish() == ("", Parsed(text="Hello"))


def test_a_call_is_held_until_the_end() -> None:
    stream = AnswerStream()
    assert stream.feed(CALL[:30]) == "" and stream.feed(CALL[30:]) == ""
    assert stream.finish() == ("", Parsed(calls=[("get_weather", '{"city":"Paris"}')]))
