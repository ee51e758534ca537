"""A multi-turn Responses conversation through the compose stack's load balancer, with the official
`openai` client: every turn is stored (`store: true`) and continues the last one
(`previous_response_id`), and haproxy's X-Served-By header says which gateway served it. Exits non-zero
(with the reason) unless the turns crossed both gateways and each continued a response the other stored.

    python scripts/smoke_conversation.py http://127.0.0.1:8000 start STATE.json
    # ... kill -9 one gateway ...
    python scripts/smoke_conversation.py http://127.0.0.1:8000 continue STATE.json

`start`: three turns (the third streamed), each stored response read back through both gateways, a
control turn without the history (fewer input tokens: the history came from the other gateway's
record) and an unknown previous_response_id (400). `continue`: two more turns of the same
conversation after a gateway was killed, from the ids `start` wrote to STATE.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai

SERVED_BY = "x-served-by"
TURNS = ["My name is Ada and I like tea.", "What is my name?", "Count from one to twenty in words."]


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)


def turn(api: openai.OpenAI, model: str, text: str, previous: str | None) -> tuple[Any, str]:
    """One stored turn; the response and the gateway that served it."""
    raw = api.responses.with_raw_response.create(
        model=model, input=text, previous_response_id=previous, store=True, max_output_tokens=24, temperature=0)
    response = raw.parse()
    served = raw.headers.get(SERVED_BY, "")
    if not served:
        raise AssertionError(f"no {SERVED_BY} header: is haproxy in front? headers: {dict(raw.headers)}")
    # incomplete: it stopped at max_output_tokens (kept small: the 135M model rambles)
    if response.status not in ("completed", "incomplete") or response.error is not None \
            or response.previous_response_id != previous or not response.output_text:
        raise AssertionError(f"turn {text!r} after {previous}: {response.model_dump_json()[:800]}")
    return response, served


def streamed_turn(api: openai.OpenAI, model: str, text: str, previous: str) -> tuple[Any, str, int, float]:
    """A streamed stored turn: the final response, its gateway, how many text deltas came and the
    seconds between the first delta's arrival and the completed event's (0 if buffered on the way)."""
    deltas: list[float] = []
    final: Any = None
    spread = 0.0
    with api.responses.with_streaming_response.create(
            model=model, input=text, previous_response_id=previous, store=True, max_output_tokens=48,
            temperature=0, stream=True) as raw:
        served = raw.headers.get(SERVED_BY, "")
        for event in raw.parse():
            if event.type == "response.output_text.delta":
                deltas.append(time.monotonic())
            elif event.type == "response.completed":
                final = event.response
                spread = time.monotonic() - deltas[0] if deltas else 0.0
    if final is None or final.previous_response_id != previous:
        raise AssertionError(f"the stream after {previous} did not complete the turn: {final}")
    return final, served, len(deltas), spread


def start(url: str, state: Path) -> str:
    api = client(url)
    model = api.models.list().data[0].id
    served: list[str] = []
    responses: list[Any] = []
    previous: str | None = None
    for text in TURNS[:2]:
        response, by = turn(api, model, text, previous)
        responses.append(response)
        served.append(by)
        previous = response.id
    assert previous is not None
    response, by, deltas, spread = streamed_turn(api, model, TURNS[2], previous)
    responses.append(response)
    served.append(by)
    if len(set(served)) < 2:
        raise AssertionError(f"every turn was served by {served[0]}: the load balancer did not spread them")
    crossings = sum(a != b for a, b in zip(served, served[1:]))
    if deltas < 2:
        raise AssertionError(f"the streamed turn came as {deltas} text delta(s)")
    if deltas >= 8 and spread < 0.02:
        raise AssertionError(f"{deltas} deltas arrived within {spread * 1000:.1f} ms: the stream was buffered on the way")

    # Every stored response, read through each gateway in turn (round robin): the same record.
    readers: dict[str, set[str]] = {}
    for response in responses:
        for _ in range(2):
            raw = api.responses.with_raw_response.retrieve(response.id)
            got = raw.parse()
            readers.setdefault(response.id, set()).add(raw.headers.get(SERVED_BY, ""))
            if got.id != response.id or got.output_text != response.output_text:
                raise AssertionError(f"{response.id} read back differs: {got.model_dump_json()[:500]}")
    if not all(len(by) == 2 for by in readers.values()):
        raise AssertionError(f"stored responses were not read through both gateways: {readers}")

    # The second turn carried the first one's history (stored by the other gateway): the same text
    # without previous_response_id is a shorter prompt.
    control = api.responses.create(model=model, input=TURNS[1], store=False, max_output_tokens=8, temperature=0)
    with_history, alone = responses[1].usage.input_tokens, control.usage.input_tokens
    if with_history <= alone:
        raise AssertionError(f"turn 2 had {with_history} input tokens, the same text alone {alone}: no history")

    try:
        api.responses.create(model=model, input="hi", previous_response_id="resp_does_not_exist", max_output_tokens=4)
        raise AssertionError("an unknown previous_response_id was accepted")
    except openai.BadRequestError as exc:
        if (exc.code or "") != "previous_response_not_found":
            raise AssertionError(f"unknown previous_response_id: {exc}") from exc

    state.write_text(json.dumps({"model": model, "last": responses[-1].id, "served": served}))
    return (f"3 turns served by {' -> '.join(served)} ({crossings} crossing(s)); streamed turn: {deltas} deltas over "
            f"{spread * 1000:.0f} ms; {len(readers)} stored responses read through both gateways; turn 2 had "
            f"{with_history} input tokens with the history, {alone} without; unknown previous id: 400")


def resume(url: str, state: Path) -> str:
    saved = json.loads(state.read_text())
    api = client(url)
    previous, served = saved["last"], []
    for text in ["And what did I say I like?", "Thank you."]:
        response, by = turn(api, saved["model"], text, previous)
        served.append(by)
        previous = response.id
    return f"2 more turns after the kill, served by {' -> '.join(served)}, continuing {saved['last']}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the load balancer's address, without /v1")
    parser.add_argument("phase", choices=["start", "continue"])
    parser.add_argument("state", type=Path, help="where `start` writes the conversation's last id for `continue`")
    args = parser.parse_args()
    try:
        run = start if args.phase == "start" else resume
        print(f"conversation ({args.phase}):", run(args.url.rstrip("/"), args.state))
    except (AssertionError, openai.OpenAIError, httpx.HTTPError) as exc:
        print(f"conversation FAILED ({args.phase}) against {args.url}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
