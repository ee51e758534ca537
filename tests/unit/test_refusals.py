"""The refusal table (gateway/api/refusals.py): each row refuses what it says, with its param and code,
and lets through the values the API serves."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.api.errors import APIError
from gateway.api.refusals import REFUSALS, Api, refuse


@pytest.mark.parametrize(("api", "body", "param", "code"), [
    ("chat", {"modalities": ["text", "audio"]}, "modalities", "unsupported_parameter"),
    ("chat", {"modalities": ["audio"]}, "modalities", "unsupported_parameter"),
    ("chat", {"audio": {"voice": "alloy"}}, "audio", "unsupported_parameter"),
    ("responses", {"background": True}, "background", "unsupported_parameter"),
    ("responses", {"conversation": {"id": "conv_1"}}, "conversation", "unsupported_parameter"),
    ("responses", {"include": ["reasoning.encrypted_content", "message.output_text.logprobs"]}, "include",
     "unsupported_parameter"),
    ("completions", {"suffix": "end"}, "suffix", "unsupported_parameter"),
    ("completions", {"best_of": 2}, "best_of", "unsupported_parameter"),
    ("completions", {"best_of": 3, "n": 2}, "best_of", "unsupported_parameter"),
    ("completions", {"best_of": 1, "n": 2}, "best_of", "invalid_value"),
    ("messages", {"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking", "unsupported_parameter"),
    ("messages", {"tools": [{"name": "f", "input_schema": {}}, {"type": "web_search_20250305", "name": "web_search"}]},
     "tools.1.type", "unsupported_parameter"),
])
def test_refused(api: Api, body: dict[str, Any], param: str, code: str) -> None:
    with pytest.raises(APIError) as caught:
        refuse(api)(body)
    assert (caught.value.status, caught.value.param, caught.value.code) == (400, param, code)


@pytest.mark.parametrize(("api", "body"), [
    ("chat", {"modalities": ["text"]}),
    ("chat", {"audio": None, "modalities": None}),
    ("responses", {"background": False, "include": ["reasoning.encrypted_content"]}),
    ("completions", {"suffix": None, "best_of": 1}),
    ("completions", {"suffix": "", "best_of": 2, "n": 2}),
    ("messages", {"thinking": {"type": "disabled"}, "tools": [{"name": "f"}, {"type": "custom", "name": "g"}]}),
    ("chat", {"thinking": {"type": "enabled"}, "background": True}),  # another API's field is that API's business
])
def test_served(api: Api, body: dict[str, Any]) -> None:
    refuse(api)(body)


def test_every_row_refuses_something() -> None:
    """A row whose test never fires would be a documented refusal that does not happen."""
    probes: dict[str, Any] = {"modalities": ["audio"], "audio": {}, "background": True, "conversation": "c",
                              "include": ["message.output_text.logprobs"], "suffix": "x", "thinking": {"type": "enabled"},
                              "tools[].type": [{"type": "bash_20250124"}]}
    for row in REFUSALS:
        if row.field == "best_of":
            body: dict[str, Any] = {"best_of": 1, "n": 2} if row.code == "invalid_value" else {"best_of": 4}
        else:
            body = {row.field.split("[")[0]: probes[row.field]}
        assert row.test(body) is not None, row
