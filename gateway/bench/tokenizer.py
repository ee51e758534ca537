"""The model's tokenizer, for endpoints that send no `usage`: a GGUF file or a tokenizer.json."""

from __future__ import annotations

from pathlib import Path

from gateway.bench.client import Counter


def load_counter(path: str) -> Counter:
    """A function that counts the tokens of a text; raises ValueError naming what is missing."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"tokenizer {path!r} does not exist")
    if p.suffix == ".gguf":
        try:
            from llama_cpp import Llama  # noqa: PLC0415 - optional
        except ImportError:
            raise ValueError("counting with a GGUF tokenizer needs llama-cpp-python (extra `llamacpp`)") from None
        vocab = Llama(model_path=str(p), vocab_only=True, verbose=False)
        return lambda text: len(vocab.tokenize(text.encode(), add_bos=False, special=False))
    file = p / "tokenizer.json" if p.is_dir() else p
    try:
        from tokenizers import Tokenizer  # noqa: PLC0415 - optional
    except ImportError:
        raise ValueError("counting with tokenizer.json needs the `tokenizers` package") from None
    tok = Tokenizer.from_file(str(file))
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)
