"""Which requests a resume cannot change, and the request that resumes one from the text it has sent.

A cut stream resumes as the same request with its text so far appended: a chat's messages end with an
assistant message holding it (`continue_final_message`, `add_generation_prompt: false`: vLLM's fields,
which llama-server and SGLang take too), a completion's prompt ends with it; `max_tokens` (and
`max_completion_tokens`, `min_tokens`) lose what was produced. Only requests whose continuation depends on
nothing but that text qualify: one choice, streamed, no tools or structured output (their parsers and
grammars start over), no seed (a seeded sample would differ), no logprobs, no stop sequences (one could
span the cut), no presence or frequency penalty (they count output tokens only), a chat not already ending
with an assistant message, a completion prompt that is one string."""

from __future__ import annotations

from typing import Any

from adapters.base import Operation

_CHANGED_BY_A_RESUME = frozenset({
    "tools", "functions", "tool_choice", "function_call", "response_format", "grammar", "json_schema", "guided_json",
    "guided_regex", "guided_choice", "guided_grammar", "structured_outputs", "seed", "logprobs", "top_logprobs",
    "stop", "echo", "suffix", "best_of", "continue_final_message", "add_generation_prompt", "n_probs",
})
_PENALTIES = ("presence_penalty", "frequency_penalty")
_LIMITS = ("max_tokens", "max_completion_tokens")


def resumable(operation: Operation, body: dict[str, Any]) -> bool:
    """Whether the gateway may cut this request's stream and resume it without changing what it means."""
    if operation not in ("chat", "completions") or body.get("stream") is not True:
        return False
    if body.get("n") not in (None, 1) or any(body.get(k) not in (None, False) for k in _CHANGED_BY_A_RESUME):
        return False
    if any(body.get(k) not in (None, 0, 0.0) for k in _PENALTIES):
        return False
    if operation == "completions":
        return isinstance(body.get("prompt"), str)
    messages = body.get("messages")
    return isinstance(messages, list) and bool(messages) and isinstance(messages[-1], dict) \
        and messages[-1].get("role") != "assistant"


def resume_body(operation: Operation, body: dict[str, Any], text: str, produced: int) -> dict[str, Any]:
    """The request that goes on from `text` (the `produced` tokens sent so far)."""
    out = dict(body)
    for key in _LIMITS:
        if isinstance(out.get(key), int):
            out[key] = max(1, out[key] - produced)
    if isinstance(out.get("min_tokens"), int):
        out["min_tokens"] = max(0, out["min_tokens"] - produced)
    if operation == "completions":
        out["prompt"] = body["prompt"] + text
        return out
    out["messages"] = [*body["messages"], {"role": "assistant", "content": text}]
    out["continue_final_message"], out["add_generation_prompt"] = True, False
    return out
