"""The cost of mending relayed chat chunks (adapters/chat_shape.py) on the relay's per-event path.

    python -m benchmarks.relay_mend [--events 200000] [--rounds 5]

Times `observe()` over a conformant content chunk and a conformant tool-call fragment, with and
without the tool-call mender, interleaved round by round; prints ns per event and the ratio.
"""

from __future__ import annotations

import argparse
import time

import orjson

from adapters.chat_shape import ToolCallDeltas
from adapters.observe import observe

CONTENT = orjson.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                        "choices": [{"index": 0, "delta": {"content": " word"}, "logprobs": None, "finish_reason": None}]})
FRAGMENT = orjson.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                         "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "ab"}}]},
                                      "logprobs": None, "finish_reason": None}]})


def _run(payload: bytes, events: int, mend: bool) -> float:
    deltas = ToolCallDeltas() if mend else None
    start = time.perf_counter()
    for _ in range(events):
        observe(payload, False, deltas)
    return (time.perf_counter() - start) / events * 1e9


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    for name, payload in (("content chunk", CONTENT), ("tool-call fragment", FRAGMENT)):
        plain, mended = [], []
        for _ in range(args.rounds):  # interleaved: the machine's noise hits both alike
            plain.append(_run(payload, args.events, False))
            mended.append(_run(payload, args.events, True))
        p, m = min(plain), min(mended)
        print(f"{name:20s} observe {p:7.0f} ns/event, with mending {m:7.0f} ns/event, ratio {m / p:.2f}")


if __name__ == "__main__":
    main()
