"""adapters/logprobs.py: pure scoring and shape functions, by table."""

from __future__ import annotations

import math

import numpy as np
import pytest

from adapters import logprobs


def test_score_pairs_each_token_with_the_logits_before_it() -> None:
    # row i predicts token i + 1: row 0 puts all mass on token 2, row 1 on token 0
    logits = np.array([[-1e9, -1e9, 0.0], [0.0, -1e9, -1e9], [0.0, 0.0, 0.0]])
    items = logprobs.score([1, 2, 0], logits, k=1)
    assert [i.logprob for i in items] == [None, pytest.approx(0.0), pytest.approx(0.0)]
    assert items[1].top == [(2, pytest.approx(0.0))]


@pytest.mark.parametrize(("row", "k", "want"), [
    ([0.0, 0.0], 1, [0]),                 # a tie: the lower id first
    ([1.0, 3.0, 2.0], 2, [1, 2]),
    ([1.0, 3.0, 2.0], 0, []),
    ([1.0, 3.0], 5, [1, 0]),              # k above the vocabulary
])
def test_top_k(row: list[float], k: int, want: list[int]) -> None:
    assert [i for i, _ in logprobs.top_k(np.array(row), k)] == want


def test_log_softmax_sums_to_one_in_float64() -> None:
    row = logprobs.log_softmax(np.random.default_rng(0).normal(size=50_000).astype(np.float32))
    assert math.isclose(float(np.exp(row).sum()), 1.0, abs_tol=1e-9)


def test_legacy_shape_offsets_and_null_first() -> None:
    items = [logprobs.TokenLogprob(5, None), logprobs.TokenLogprob(6, -0.5, [(7, -0.1)])]
    out = logprobs.legacy(items, ["Hi", " there"], {7: "!"}, start=3)
    assert out == {"tokens": ["Hi", " there"], "token_logprobs": [None, -0.5],
                   "top_logprobs": [None, {"!": -0.1, " there": -0.5}], "text_offset": [3, 5]}


def test_chat_shape() -> None:
    out = logprobs.chat([logprobs.TokenLogprob(1, -0.2, [(1, -0.2), (2, -1.0)])], [b"a"], {1: b"a", 2: b"b"}, k=1)
    assert out == {"content": [{"token": "a", "logprob": -0.2, "bytes": [97],
                                "top_logprobs": [{"token": "a", "logprob": -0.2, "bytes": [97]}]}], "refusal": None}


@pytest.mark.parametrize(("texts", "length", "kept"), [
    (["a", "b", "c"], 3, 3),
    (["a", "b", "</s>"], 2, 2),     # a stop sequence cut the text
    (["a", "", "b"], 1, 2),         # an empty piece at the cut stays with the one before
])
def test_keep_within(texts: list[str], length: int, kept: int) -> None:
    items = [logprobs.TokenLogprob(i, -1.0) for i in range(len(texts))]
    assert logprobs.keep_within(items, texts, length) == kept


def test_legacy_from_llama_servers_chat_shape() -> None:
    content = [{"id": 1, "token": "Hi", "logprob": -0.3, "top_logprobs": [{"id": 2, "token": "Ho", "logprob": -0.1}]}]
    assert logprobs.legacy_from_chat(content, k=1) == {"tokens": ["Hi"], "token_logprobs": [-0.3],
                                                       "top_logprobs": [{"Ho": -0.1, "Hi": -0.3}], "text_offset": [0]}
