"""The adapter contract: one engine instance serving one model.

Every engine, in-process or behind its own server, implements `Adapter`. The API layer
only ever sees `Completion` (a whole response) or an async iterator of `StreamEvent`
(one SSE event each, already encoded, so a relay can pass upstream bytes through
without re-serialising them).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from adapters.spec import EngineSpec

Operation = Literal["chat", "completions", "embeddings", "responses"]


@dataclass(frozen=True, slots=True)
class Capabilities:
    chat: bool = True
    completions: bool = True
    embeddings: bool = False
    responses: bool = False
    """The engine serves /v1/responses itself (the gateway translates to chat for the others)."""
    tools: bool = False
    structured_output: bool = False
    n_choices: bool = False  # n > 1
    logprobs: bool = False
    image_input: bool = False
    """Takes image content parts (a vision model); refused with 400 before sending otherwise."""
    audio_input: bool = False
    """Takes audio content parts (input_audio)."""

    def supports(self, operation: Operation) -> bool:
        match operation:
            case "chat":
                return self.chat
            case "completions":
                return self.completions
            case "embeddings":
                return self.embeddings
            case "responses":
                return self.responses


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None
    """Prompt tokens the engine reused from its cache (`usage.prompt_tokens_details.cached_tokens`,
    llama-server's `timings.cache_n`); None where the engine does not say."""
    prefill_seconds: float | None = None
    """How long the engine itself spent on the uncached prompt (llama-server's `timings.prompt_ms`)."""

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def as_dict(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }


@dataclass(slots=True)
class Completion:
    """A whole (non-streamed) response: `body` is the OpenAI JSON object, ready to send."""

    body: dict[str, Any] | bytes
    usage: Usage | None = None
    status: int = 200


@dataclass(slots=True)
class StreamEvent:
    """One SSE event. `data` is the JSON payload sent as `data: <data>\\n\\n`.

    The other fields are what the gateway observes for metrics; they never change `data`.
    `has_content` marks an event that carries generated text (or a tool call), so the first
    one times TTFT. `usage` is set on the event that reports the final counts.
    An event whose `data` is empty is observed only, never sent: a relay uses it for the
    usage chunk it asked the engine for when the client did not ask for include_usage.
    """

    data: bytes
    has_content: bool = False
    usage: Usage | None = None
    finish_reason: str | None = None
    is_error: bool = False
    more: bool = False
    """Another event that came in the same upstream read follows at once: a writer may hold this
    one's bytes and send them together with the rest (the relay passes on what it read in one
    piece as one piece; it never holds an event back to wait for another)."""


@dataclass(slots=True)
class RequestContext:
    """What the API layer hands an adapter besides the body."""

    request_id: str
    model: str  # the served model id the client asked for
    include_usage: bool = False  # the client asked for stream_options.include_usage
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class EngineStats:
    """The engine's own view, mapped from its metrics onto the gateway's names; None = not reported."""

    requests_running: float | None = None
    requests_waiting: float | None = None
    kv_cache_usage_ratio: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    ttft_seconds_sum: float | None = None
    ttft_seconds_count: float | None = None
    draft_tokens_total: float | None = None
    """Speculative decoding: tokens drafted (the engine's counter)."""
    draft_accepted_tokens_total: float | None = None
    """Speculative decoding: drafted tokens the model accepted."""


@dataclass(frozen=True, slots=True)
class Health:
    ready: bool
    detail: str = ""


class EngineError(Exception):
    """The engine failed (not the client): mapped to 500/502/503 in OpenAI's shape."""

    def __init__(self, message: str, status: int = 500, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code


class UnsupportedError(Exception):
    """The client asked for something this engine cannot do: mapped to 400."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class ClientRequestError(Exception):
    """The engine rejected the request as invalid: relayed as the engine's 4xx status."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code


ChatResult = Completion | AsyncIterator[StreamEvent]


class Adapter(abc.ABC):
    """One engine instance serving one model.

    `start()` returns once the engine is ready by its own readiness rule; `stop()` leaves no
    process or thread behind. Operations take the parsed request body (a dict of OpenAI
    fields, unknown ones included) and return a `Completion`, or an async iterator of
    `StreamEvent` when the body asks for `stream`. Closing that iterator early (client gone)
    must cancel the generation.
    """

    engine: str = ""
    capabilities: Capabilities = Capabilities()
    default_concurrency: int = 1
    """Requests the gateway lets through to the engine at once (more wait in its queue). Engines
    that batch (servers) take many; an in-process model instance generates one at a time."""
    container_image: str | None = None
    """The engine's official container image, for deploy/ (None: the engine runs in the gateway's own)."""
    continues: bool = False
    """It continues a final assistant message and a completions prompt (a cut stream can resume)."""

    def declare(self, spec: EngineSpec) -> None:
        """Take the engine's declared facts (name, capabilities, concurrency, image) from its spec."""
        self.engine = spec.name
        self.capabilities = spec.capabilities
        self.default_concurrency = spec.default_concurrency
        self.container_image = spec.container_image
        self.continues = spec.continues

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    async def stop(self) -> None: ...

    @abc.abstractmethod
    async def health(self) -> Health: ...

    async def chat(self, body: dict[str, Any], ctx: RequestContext) -> ChatResult:
        raise UnsupportedError(f"{self.engine} does not serve chat completions")

    async def tokenize(self, body: dict[str, Any], ctx: RequestContext) -> Completion:
        """vLLM's /tokenize: {prompt | messages, add_special_tokens} -> {count, max_model_len, tokens}."""
        raise UnsupportedError(f"the {self.engine} engine has no tokenizer the gateway can reach "
                               "(llamacpp, llama-server, vllm and sglang have)", "model")

    async def detokenize(self, body: dict[str, Any], ctx: RequestContext) -> Completion:
        """vLLM's /detokenize: {tokens} -> {prompt}."""
        raise UnsupportedError(f"the {self.engine} engine has no tokenizer the gateway can reach", "model")

    async def tokenizer_info(self, ctx: RequestContext) -> Completion:
        """vLLM's /tokenizer_info: the special tokens and chat template (lm-eval's remote tokenizer reads them)."""
        raise UnsupportedError(f"the {self.engine} engine has no tokenizer the gateway can reach", "model")

    async def completions(self, body: dict[str, Any], ctx: RequestContext) -> ChatResult:
        raise UnsupportedError(f"{self.engine} does not serve text completions")

    async def embeddings(self, body: dict[str, Any], ctx: RequestContext) -> Completion:
        raise UnsupportedError(f"{self.engine} does not serve embeddings")

    async def responses(self, body: dict[str, Any], ctx: RequestContext) -> ChatResult:
        """The engine's own /v1/responses (capabilities.responses), stateless: the gateway keeps the state."""
        raise UnsupportedError(f"{self.engine} does not serve the Responses API natively")

    def gave_up(self) -> str | None:
        """Why the engine stopped serving for good (its supervisor gave up on a crash loop), or None."""
        return None

    def ready_now(self) -> bool | None:
        """Whether the engine serves now, known without I/O (a supervised process's state); None: unknown."""
        return None

    def incarnation(self) -> object:
        """Changes whenever the engine may have lost what it held in memory (its KV and prompt caches):
        a supervised process's pid and restart count. None: not known (an external server)."""
        return None

    async def engine_stats(self) -> EngineStats | None:
        """The engine's own metrics (queue, KV cache, tokens), polled by the gateway."""
        return None

    def memory_bytes(self) -> int | None:
        """What an in-process engine itself reports holding once loaded (weights + reserved KV cache);
        None: not reported (an engine server's memory is measured from its processes instead)."""
        return None

    def logs(self, lines: int = 100) -> list[str]:
        """The last lines of the engine's own log; empty for engines with none (in-process)."""
        return []

    def describe(self) -> dict[str, Any]:
        """Facts for /v1/models and the start-up summary (context length, file, ...)."""
        return {}
