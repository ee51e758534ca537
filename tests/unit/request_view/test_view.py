"""The request view and its estimate, as tables: what each API's body becomes, what it is counted as."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.cache_routing.blocks import chain, prompt_text
from gateway.request_view import RequestView, Turn, text_tokens, view_of
from gateway.request_view.view import DEFAULT_SYSTEM, GENERATION_PROMPT, IMAGE_TOKENS, PER_MESSAGE, TOOLS_PREAMBLE
from gateway.routing.route_key import prefix_text, route_key
from gateway.scheduling.prompt import prompt_tokens

CHAT = PER_MESSAGE + GENERATION_PROMPT  # one message and the assistant's opening
DATA_URL = "data:image/png;base64," + "A" * 1_000_000
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


@pytest.mark.parametrize(("text", "tokens"), [
    ("", 0),
    ("hello", 2),  # ASCII letters: 4 a token, rounded up
    ("x" * 40, 10),
    ("2026", 4),  # digits: one each
    ("a.b", 1),  # punctuation: half each
    ("Быстрая", 7),  # 2-byte characters: one each
    ("敏捷", 4),  # CJK: two each
    ("ゲート", 6),  # kana
    ("게이트", 6),  # hangul
    ("😀", 3),  # 4-byte: three
    ("敏" * 4000, 8000),  # was 1,001 (chars / 4)
])
def test_text_by_script(text: str, tokens: int) -> None:
    assert text_tokens(text) == tokens


def test_a_text_past_the_classified_prefix_is_charged_at_its_rate() -> None:
    assert text_tokens("敏" * 3_000_000) == 6_000_000


@pytest.mark.parametrize(("name", "body", "tokens"), [
    ("one message, the template's system prompt", {"messages": [{"role": "user", "content": "hello"}]},
     2 + CHAT + DEFAULT_SYSTEM),
    ("a system message of its own", {"messages": [{"role": "system", "content": "be terse"}, {"role": "user", "content": "hello"}]},
     2 + 2 + PER_MESSAGE + CHAT),
    ("an image is a fixed count, not its data URL", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": DATA_URL}}]}]},
     1 + IMAGE_TOKENS + CHAT + DEFAULT_SYSTEM),
    ("4,000 CJK characters", {"messages": [{"role": "user", "content": "敏" * 4000}]}, 8000 + CHAT + DEFAULT_SYSTEM),
    ("tools by their JSON", {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS},
     1 + CHAT + DEFAULT_SYSTEM + TOOLS_PREAMBLE + text_tokens(orjson.dumps(TOOLS, option=orjson.OPT_SORT_KEYS).decode())),
    ("token ids one each, and a BOS", {"prompt": [1, 2, 3]}, 4),
    ("a batch of prompts", {"prompt": ["abcd", "abcdefgh"]}, 1 + 1 + 2 + 1),
    ("a token-id batch", {"prompt": [[1, 2], [3]]}, 5),
    ("Responses: instructions replace the default system", {"input": [{"role": "user", "content": "hi"}],
                                                            "instructions": "be brief"}, 1 + CHAT + PER_MESSAGE + 2),
    ("Responses: a string input", {"input": "abcd"}, 2),
    ("nothing", {}, 0),
])
def test_prompt_estimate(name: str, body: dict[str, Any], tokens: int) -> None:
    view = view_of(body)
    assert view.prompt_tokens == tokens, name
    assert prompt_tokens(body) == prompt_tokens(view) == tokens  # the scheduler counts the same


@pytest.mark.parametrize(("body", "generates", "max_output", "choices"), [
    ({"messages": [], "max_tokens": 16}, True, 16, 1),
    ({"messages": [], "max_completion_tokens": 8, "max_tokens": 16}, True, 8, 1),  # chat's newer name wins
    ({"input": "x", "max_output_tokens": 7}, True, 7, 1),  # Responses
    ({"messages": [], "n": 12, "max_tokens": 40}, True, 40, 12),
    ({"prompt": ["a", "b", "c"], "n": 2, "max_tokens": 5}, True, 5, 6),  # n per prompt of a batch
    ({"prompt": "a", "n": 2, "best_of": 5}, True, None, 5),  # best_of generates them all
    ({"messages": [], "n": True, "max_tokens": False}, True, None, 1),  # booleans are no numbers
    ({"input": ["a", "b"]}, False, None, 0),  # embeddings generate nothing
])
def test_output_and_choices(body: dict[str, Any], generates: bool, max_output: int | None, choices: int) -> None:
    view = view_of(body, generates=generates)
    assert (view.max_output, view.choices) == (max_output, choices)


def test_turns_keep_roles_text_calls_and_media() -> None:
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    view = view_of({"messages": [
        {"role": "user", "content": [{"type": "text", "text": "see "}, {"type": "image_url", "image_url": {"url": DATA_URL}},
                                     {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
        "not a message",
    ], "user": "u-1"})
    assert view.turns == (Turn("user", "see ", "", 1, 1), Turn("assistant", "", orjson.dumps(calls, option=orjson.OPT_SORT_KEYS).decode()),
                          Turn("tool", "42"))
    assert (view.images, view.audio, view.user) == (1, 1, "u-1")


# Hashes of the same prompts from the block cutter before the view (commit 2514ee3): a replica's index
# holds these, so the same prompt must hash the same after the change.
GOLDEN: list[tuple[dict[str, Any], list[int]]] = [
    ({"messages": [{"role": "system", "content": "You are terse. " * 8},
                   {"role": "user", "content": "Summarise the attached report in three lines, please."}]},
     [0x5d16dcfc11936dae, 0x7d0da06fda3b3662]),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "What is in this picture? Describe it in detail: "},
                                                {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 4000}},
                                                {"type": "text", "text": "and its colours."}]}]},
     [0x9c215ea711cc0337]),
    ({"prompt": "Once upon a time, in a land far away, there lived a gateway that counted tokens. " * 2},
     [0xc6992987fd141de7, 0x91bb607630b13014]),
    ({"prompt": [list(range(1, 29))]}, [0xe7948c0e820a8dd3]),
]


@pytest.mark.parametrize(("body", "hashes"), GOLDEN)
def test_block_hashes_are_those_of_before(body: dict[str, Any], hashes: list[int]) -> None:
    text = prompt_text(view_of(body))
    assert text is not None and list(chain(text, 64)) == hashes


def test_tool_calls_are_part_of_the_cached_text() -> None:
    """Before the view, an assistant's tool calls hashed as "" (the list's text parts): two conversations that
    differ only in the calls they made shared every block."""
    def body(city: str) -> dict[str, Any]:
        call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": f'{{"city": "{city}"}}'}}
        return {"messages": [{"role": "user", "content": "x" * 200}, {"role": "assistant", "content": None, "tool_calls": [call]},
                             {"role": "tool", "content": "sunny " * 20, "tool_call_id": "c1"}]}
    a, b = (chain(prompt_text(view_of(body(c))) or "", 64) for c in ("Paris", "Tokyo"))
    assert a[:3] == b[:3] and a[3:] != b[3:]


def test_route_keys_of_token_ids_and_responses_items() -> None:
    assert prefix_text(view_of({"prompt": [1, 2, 3]}), 2) == "[1,2]"  # a bare id list had no key before
    items = view_of({"input": [{"role": "user", "content": "hello"}]})
    assert prefix_text(items, 100) == prefix_text(view_of({"messages": [{"role": "user", "content": "hello"}]}), 100)
    assert route_key(items, {}, "x-session-id", 100).prefix is not None


def test_the_view_is_immutable() -> None:
    view = view_of({"messages": [{"role": "user", "content": "hi"}]})
    with pytest.raises(AttributeError):
        view.prompt_tokens = 0  # type: ignore[misc]
    assert isinstance(view, RequestView) and hash(view.turns)


def nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize("body", [
    {"messages": [{"role": "user", "content": nested(300)}]},  # past orjson's 254 levels of dumps (loads takes 1024)
    {"messages": [{"role": "assistant", "tool_calls": nested(300)}], "tools": nested(300)},
    {"messages": [{"role": 7, "content": [None, 3, "s", {"type": ["image_url"]}, {"text": 5}]}]},
    {"messages": "not a list", "prompt": {"a": 1}, "n": -3, "max_tokens": "16", "user": 5},
    {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}, {"type": "function_call_output", "output": nested(300)}]},
    {"prompt": [[1, "a", True], "b", None]},
    {"input": [1.5, {}]},
])
def test_a_strange_body_is_viewed_never_an_error(body: dict[str, Any]) -> None:
    view = view_of(body)
    assert view.prompt_tokens >= 0 and view.choices >= 1 and view.max_output is None
    assert isinstance(prompt_text(view) or "", str) and isinstance(prefix_text(view, 100) or "", str)  # the readers too
