"""Facts about the embedded model, read from its GGUF file (never hard-coded in tests)."""

from __future__ import annotations

from functools import lru_cache

import gguf

from gateway.modelsource import embedded_model_path


@lru_cache(maxsize=1)
def _reader() -> gguf.GGUFReader:
    return gguf.GGUFReader(str(embedded_model_path()))


def _field(key: str) -> object:
    return _reader().fields[key].contents()


def embedding_length() -> int:
    arch = str(_field("general.architecture"))
    return int(_field(f"{arch}.embedding_length"))  # type: ignore[call-overload]


def eos_token_id() -> int:
    return int(_field("tokenizer.ggml.eos_token_id"))  # type: ignore[call-overload]
