"""What the bench sends: prompts of given token lengths, or prompts from a JSONL file."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson

Endpoint = Literal["chat", "completions"]

# Common English words that most BPE vocabularies hold as one token each (with the leading space),
# so a prompt of N words is close to N tokens; the report uses the endpoint's own count anyway.
_WORDS = (
    "the of and to in is was for on are with as be at by this had not but from have or one what all were "
    "when we there can an your which their said if do will each about how up out them then she many some so "
    "these would other into has more her two like him see time could no make than first been its who now "
    "people my made over did down only way find use may water long little very after words called just where "
    "most know get through back much go good new write our me man too any day same right look think also "
    "around another came come work three word must because does part even place well such here take why things "
    "help put years different away again off went old number great tell men say small every found still "
    "between name should home big give air line set own under read last never us left end along while might "
    "next sound below saw something thought both few those always looked show large often together asked house "
    "world going want school important until form food keep children feet land side without boy once animals "
    "life enough took sometimes four head above kind began almost live page got earth need far hand high year "
    "mother light parts country father let night following picture being study second eyes soon times story "
    "boys since white days ever paper hard near sentence better best across during today others sure means "
    "knew its try told young miles sun ways thing whole hear example heard several change answer room sea "
    "against top turned learn point city play toward five using himself usually"
).split()


@dataclass(frozen=True)
class Length:
    """A token length: fixed `n`, uniform `lo-hi`, or normal `mean:std` (clipped to >= 1)."""

    kind: Literal["fixed", "uniform", "normal"]
    a: int
    b: int = 0

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return self.a
        if self.kind == "uniform":
            return rng.randint(self.a, self.b)
        return max(1, round(rng.gauss(self.a, self.b)))

    @property
    def mean(self) -> int:
        return self.a if self.kind != "uniform" else (self.a + self.b) // 2

    def __str__(self) -> str:
        return {"fixed": f"{self.a}", "uniform": f"{self.a}-{self.b}", "normal": f"{self.a}:{self.b}"}[self.kind]


def parse_length(text: str) -> Length:
    """`128`, `64-256` (uniform) or `128:32` (normal mean:std)."""
    try:
        if "-" in text:
            lo, hi = (int(x) for x in text.split("-", 1))
            if not 1 <= lo <= hi:
                raise ValueError
            return Length("uniform", lo, hi)
        if ":" in text:
            mean, std = (int(x) for x in text.split(":", 1))
            if mean < 1 or std < 0:
                raise ValueError
            return Length("normal", mean, std)
        n = int(text)
        if n < 1:
            raise ValueError
        return Length("fixed", n)
    except ValueError:
        raise ValueError(f"bad token length {text!r}: use N, LO-HI or MEAN:STD with positive integers") from None


@dataclass(frozen=True)
class BenchRequest:
    """One request's body minus model/stream fields, and the output length it asks for.

    `headers` are sent on top of the target's; `keep_text` keeps the generated text on the result
    (a multi-turn session carries it into its next turn); `turn` is the session turn, 1-based."""

    body: dict[str, Any]
    max_tokens: int
    prompt_text: str
    headers: dict[str, str] = field(default_factory=dict)
    keep_text: bool = False
    turn: int | None = None


def synthetic_prompt(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n_words))


def _as_body(endpoint: Endpoint, prompt: str | None, messages: list[dict[str, Any]] | None) -> tuple[dict[str, Any], str]:
    if messages is None:
        assert prompt is not None
        messages = [{"role": "user", "content": prompt}]
    text = prompt if prompt is not None else "\n".join(str(m.get("content", "")) for m in messages)
    if endpoint == "chat":
        return {"messages": messages}, text
    return {"prompt": text}, text


class PromptSource:
    """Makes the requests for one level; the same seed gives the same requests, so two endpoints
    compared side by side see identical work."""

    def __init__(self, endpoint: Endpoint, input_len: Length, output_len: Length,
                 records: list[dict[str, Any]] | None = None) -> None:
        self.endpoint = endpoint
        self.input_len = input_len
        self.output_len = output_len
        self.records = records

    def make(self, rng: random.Random, index: int) -> BenchRequest:
        if self.records is not None:
            record = self.records[index % len(self.records)]
            out = record.get("max_tokens") or record.get("output_tokens") or self.output_len.sample(rng)
            body, text = _as_body(self.endpoint, record.get("prompt"), record.get("messages"))
            return BenchRequest(body, int(out), text)
        prompt = synthetic_prompt(rng, self.input_len.sample(rng))
        body, text = _as_body(self.endpoint, prompt, None)
        return BenchRequest(body, self.output_len.sample(rng), text)

    def describe(self) -> str:
        if self.records is not None:
            return f"{len(self.records)} prompts from a JSONL file, output {self.output_len} tokens unless given"
        return f"synthetic prompts, input {self.input_len} tokens, output {self.output_len} tokens"


def load_jsonl(path: Path) -> list[dict[str, Any]]:
    """Lines of {"prompt": str} or {"messages": [...]}, with optional "max_tokens"."""
    records: list[dict[str, Any]] = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not JSON: {exc}") from None
        if not isinstance(record, dict) or not (
            isinstance(record.get("prompt"), str) or isinstance(record.get("messages"), list)
        ):
            raise ValueError(f'{path}:{number}: each line needs "prompt" (a string) or "messages" (a list)')
        out = record.get("max_tokens", record.get("output_tokens"))
        if out is not None and (not isinstance(out, int) or out < 1):
            raise ValueError(f"{path}:{number}: max_tokens must be a positive integer")
        records.append(record)
    if not records:
        raise ValueError(f"{path}: no prompts")
    return records
