"""The cost of writing a LoRA adapter's name into its relayed chunks (adapters/model_name.py).

    python -m benchmarks.lora_rename [--events 200000] [--rounds 5]

A base model's request does neither: its chunks pass as the engine wrote them. An adapter's request on
llama-server or SGLang (which answer under the base's name) pays `renamed_json` once per chunk, on top of the
`observe()` the relay already does for every chunk: a byte replacement where the engine's compact name is
there, a parse otherwise. Interleaved round by round; prints ns per event and each ratio to observe alone.
"""

from __future__ import annotations

import argparse
import time

import orjson

from adapters.model_name import _pair, renamed_json
from adapters.observe import observe

CHUNK = orjson.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "base-model",
                      "system_fingerprint": "b1-abc", "choices": [{"index": 0, "delta": {"content": " word"},
                                                                   "logprobs": None, "finish_reason": None}]})


def _run(events: int, rename: str | None) -> float:
    """rename None: pass-through; "bytes": the engine's compact name replaced; "parse": parsed and written again."""
    pair = _pair("support-bot", "base-model") if rename == "bytes" else None  # once per stream, as renamed_events
    start = time.perf_counter()
    for _ in range(events):
        observe(renamed_json(CHUNK, "support-bot", pair=pair) if rename else CHUNK, False, None)
    return (time.perf_counter() - start) / events * 1e9


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    plain, replaced, parsed = [], [], []
    for _ in range(args.rounds):  # interleaved: the machine's noise hits all alike
        plain.append(_run(args.events, None))
        replaced.append(_run(args.events, "bytes"))
        parsed.append(_run(args.events, "parse"))
    p, b, j = min(plain), min(replaced), min(parsed)
    print(f"content chunk: observe alone (a base model's request) {p:6.0f} ns/event; observe + rename of the engine's "
          f"compact name {b:6.0f} ns/event (ratio {b / p:.2f}); observe + rename by parsing {j:6.0f} ns/event "
          f"(ratio {j / p:.2f})")


if __name__ == "__main__":
    main()
