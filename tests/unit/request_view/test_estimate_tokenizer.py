"""The estimate against the embedded model's real tokenizer (SmolLM2's, through llama_cpp, vocabulary only)
and its chat template: the ratios gateway/request_view/estimate.py states, measured again."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jinja2
import pytest

from gateway.modelsource import embedded_model_path
from gateway.request_view import text_tokens, view_of

llama_cpp = pytest.importorskip("llama_cpp")

SAMPLES = {
    "english": "The quick brown fox jumps over the lazy dog. A gateway admits a request when its key has budget "
               "left, and charges what the engine reports when it ends. ",
    "code": "def reserve(self, record: KeyRecord, model: str) -> Ticket:\n    policy = record.policy\n"
            "    if not policy.limited:\n        return Ticket(record.name, model)\n",
    "json": '[{"function":{"description":"Get the weather in a city.","name":"get_weather","parameters":'
            '{"properties":{"city":{"type":"string"}},"required":["city"],"type":"object"}},"type":"function"}]',
    "numbers": "3.14159265358979323846264338327950288419716939937510 2026-12-03 ",
    "french": "Le renard brun et rapide saute par-dessus le chien paresseux. Une passerelle admet une requête. ",
    "russian": "Быстрая коричневая лиса прыгает через ленивую собаку. Шлюз принимает запрос. ",
    "greek": "Η γρήγορη καφέ αλεπού πηδά πάνω από τον τεμπέλη σκύλο. ",
    "arabic": "الثعلب البني السريع يقفز فوق الكلب الكسول. تقبل البوابة الطلب. ",
    "hindi": "तेज़ भूरी लोमड़ी आलसी कुत्ते के ऊपर कूदती है। ",
    "chinese": "敏捷的棕色狐狸跳过了懒狗。当密钥还有预算时，网关会接受请求，并在结束时按引擎报告的数量收费。",
    "japanese": "素早い茶色の狐が怠け者の犬を飛び越える。キーに予算が残っていれば、ゲートウェイは要求を受け入れます。",
    "korean": "빠른 갈색 여우가 게으른 개를 뛰어넘는다. 키에 예산이 남아 있으면 게이트웨이는 요청을 받아들인다. ",
    "emoji": "😀🎉🚀🔥👍🐍🌍",
}
LOW, HIGH = 0.7, 1.7
"""Natural text of every script: the estimate over the engine's count (docstring of estimate.py)."""


@pytest.fixture(scope="module")
def vocab() -> Iterator[Any]:
    yield llama_cpp.Llama(str(embedded_model_path()), vocab_only=True, verbose=False)


def count(vocab: Any, text: str) -> int:
    return len(vocab.tokenize(text.encode(), add_bos=False, special=True))


@pytest.mark.parametrize("name", list(SAMPLES))
def test_natural_text_is_estimated_near_the_tokenizers_count(vocab: Any, name: str) -> None:
    text = SAMPLES[name] * 10
    real, estimate = count(vocab, text), text_tokens(text)
    print(f"{name}: {len(text)} characters, {real} tokens, estimated {estimate} ({estimate / real:.2f})")
    assert LOW * real <= estimate <= HIGH * real


def test_no_text_takes_more_tokens_than_bytes(vocab: Any) -> None:
    """The ceiling the documented bound uses: random characters defeat the estimate, never a byte-level BPE's one token a byte."""
    hostile = "".join(chr(33 + (i * 7919) % 94) for i in range(4000)) + "".join(chr(0xAC00 + (i * 7919) % 11172) for i in range(500))
    real = count(vocab, hostile)
    assert text_tokens(hostile) < real <= len(hostile.encode())


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "hello"}],
    [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "What colour is the sky?"}],
    [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "Hi! How can I help?"},
     {"role": "user", "content": "Tell me about budgets."}],
    [{"role": "user", "content": SAMPLES["english"] * 5}],
])
def test_a_conversation_is_not_estimated_below_the_rendered_template(vocab: Any, messages: list[dict[str, str]]) -> None:
    """The model's own chat template, rendered and tokenized: the estimate covers it (so the budget bound is 0
    for such prompts), and by no more than a few dozen tokens a message."""
    template = vocab.metadata["tokenizer.chat_template"]
    rendered = jinja2.Environment().from_string(template).render(messages=messages, add_generation_prompt=True)
    real, estimate = count(vocab, rendered), view_of({"messages": messages}).prompt_tokens
    print(f"{len(messages)} message(s): template {real} tokens, estimated {estimate}")
    assert real <= estimate <= real + 24 * len(messages) + 0.25 * real
