"""Bench prompts, lengths, request bodies and the report's tables."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from gateway.bench.client import Target, _content_of
from gateway.bench.report import table
from gateway.bench.workload import BenchRequest, Length, PromptSource, load_jsonl, parse_length


def test_parse_length_forms() -> None:
    assert parse_length("128") == Length("fixed", 128)
    assert parse_length("64-256") == Length("uniform", 64, 256)
    assert parse_length("128:32") == Length("normal", 128, 32)
    for bad in ("0", "x", "9-3", "-5", "10:-1", ""):
        with pytest.raises(ValueError, match="bad token length"):
            parse_length(bad)


def test_lengths_sample_within_their_shape() -> None:
    rng = random.Random(1)
    assert {Length("fixed", 7).sample(rng) for _ in range(10)} == {7}
    uniform = [Length("uniform", 3, 5).sample(rng) for _ in range(200)]
    assert set(uniform) == {3, 4, 5}
    normal = [Length("normal", 100, 10).sample(rng) for _ in range(2000)]
    assert 97 < sum(normal) / len(normal) < 103 and min(normal) >= 1


def test_synthetic_prompts_have_the_word_count_and_repeat_with_the_seed() -> None:
    source = PromptSource("chat", Length("fixed", 40), Length("fixed", 8))
    a = source.make(random.Random(5), 0)
    b = source.make(random.Random(5), 0)
    assert a == b
    assert len(a.body["messages"][0]["content"].split()) == 40 and a.max_tokens == 8
    c = source.make(random.Random(6), 0)
    assert c.body != a.body


def test_completions_endpoint_gets_a_prompt() -> None:
    source = PromptSource("completions", Length("fixed", 3), Length("fixed", 2))
    req = source.make(random.Random(0), 0)
    assert set(req.body) == {"prompt"} and len(req.body["prompt"].split()) == 3


def test_jsonl_prompts(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hello there", "max_tokens": 5}\n\n{"messages": [{"role": "user", "content": "hi"}]}\n')
    records = load_jsonl(path)
    source = PromptSource("chat", Length("fixed", 1), Length("fixed", 9), records)
    first, second, third = (source.make(random.Random(0), i) for i in range(3))
    assert first.body == {"messages": [{"role": "user", "content": "hello there"}]} and first.max_tokens == 5
    assert second.body["messages"][0]["content"] == "hi" and second.max_tokens == 9
    assert third == first  # the file cycles


@pytest.mark.parametrize("text, message", [
    ("not json\n", "not JSON"),
    ('{"other": 1}\n', "needs"),
    ('{"prompt": "x", "max_tokens": 0}\n', "positive"),
    ("\n", "no prompts"),
])
def test_jsonl_errors_are_clear(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_jsonl(path)


def test_target_url_and_body() -> None:
    req = BenchRequest({"messages": [{"role": "user", "content": "x"}]}, 16, "x")
    t = Target("a", "http://h:1", "m", api_key="k")
    assert t.url == "http://h:1/v1/chat/completions"
    assert Target("a", "http://h:1/v1/", "m", endpoint="completions").url == "http://h:1/v1/completions"
    body = t.body(req)
    assert body["max_tokens"] == 16 and body["min_tokens"] == 16 and body["ignore_eos"] is True
    assert body["stream_options"] == {"include_usage": True} and body["model"] == "m"
    assert t.headers()["Authorization"] == "Bearer k"
    loose = Target("a", "http://h:1", "m", hold_length=False, stream=False).body(req)
    assert "ignore_eos" not in loose and "stream" not in loose


def test_content_detection_ignores_role_only_and_empty_deltas() -> None:
    assert _content_of({"choices": [{"delta": {"role": "assistant", "content": ""}}]}) == ("", False)
    assert _content_of({"choices": [{"delta": {"role": "assistant", "content": None}}]}) == ("", False)
    assert _content_of({"choices": [{"delta": {"content": "hi"}}]}) == ("hi", True)
    assert _content_of({"choices": [{"delta": {"tool_calls": [{"index": 0}]}}]})[1] is True
    assert _content_of({"choices": [{"text": "x", "index": 0}]}) == ("x", True)
    assert _content_of({"choices": [], "usage": {}}) == ("", False)


def test_table_is_markdown() -> None:
    text = table(["a", "bb"], [["1", "2"], ["333", "4"]])
    lines = text.splitlines()
    assert lines[0] == "| a   | bb |" and lines[1] == "|-----|----|" and lines[3] == "| 333 | 4  |"


def test_each_level_and_target_draws_its_own_prompts() -> None:
    from gateway.bench.runner import level_seed

    seeds = {level_seed(7, level, target) for level in range(50) for target in range(2)}
    assert len(seeds) == 100
    source = PromptSource("chat", Length("fixed", 20), Length("fixed", 4))
    a = source.make(random.Random(level_seed(7, 0, 0) * 1_000_003), 0)
    b = source.make(random.Random(level_seed(7, 0, 1) * 1_000_003), 0)
    assert a.body != b.body  # an engine shared by both targets must not see a prompt twice
    assert len(a.body["messages"][0]["content"].split()) == len(b.body["messages"][0]["content"].split())
