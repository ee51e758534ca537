"""MLX in-process through `mlx_lm`: load, chat template, stream_generate, sampler, stop sequences.

Same concurrency rule as the llama.cpp adapter: one worker thread owns the model (MLX's
generation stream is thread-local, so loading and generating on that one thread is also what
MLX wants); streams are fed from it through `call_soon_threadsafe`, and closing a stream sets
a flag the thread checks after every token. `mlx_lm` applies no stop strings itself, so
`StopMatcher` cuts them here, holding back text that may still become one.

On Linux the package is `mlx[cpu]` (plain `mlx-lm` there installs no mlx at all); on Apple
silicon `mlx-lm` alone brings the Metal build.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from adapters.base import (
    Adapter,
    Capabilities,
    Completion,
    EngineError,
    EngineStats,
    Health,
    RequestContext,
    StreamEvent,
    UnsupportedError,
    Usage,
)
from adapters.stops import StopMatcher, stop_list
from adapters.thread_stream import ThreadStream
from adapters.config import EngineConfig
from adapters.counters import StatsCounter
from adapters.spec import EngineSpec

log = logging.getLogger("enginegate.mlx")

INSTALL_HINT = (
    "pip install 'mlx-lm'" if sys.platform == "darwin" else "pip install 'mlx[cpu]' mlx-lm  (or: pip install 'enginegate[mlx]')"
)
OPENAI_DEFAULT_TEMPERATURE = 1.0


@dataclass(slots=True)
class _Outcome:
    finish_reason: str | None  # None: cancelled
    usage: Usage


class _Request:
    """One generation: prompt tokens and the sampling settings, translated from the OpenAI body."""

    def __init__(self, tokens: list[int], max_tokens: int, body: dict[str, Any]) -> None:
        self.tokens = tokens
        self.max_tokens = max_tokens
        self.temperature = float(_number(body, "temperature", OPENAI_DEFAULT_TEMPERATURE))
        self.top_p = float(_number(body, "top_p", 1.0))
        self.top_k = int(_number(body, "top_k", 0))
        self.min_p = float(_number(body, "min_p", 0.0))
        self.seed = body.get("seed")
        try:
            self.stops = stop_list(body.get("stop"))
        except ValueError as exc:
            raise UnsupportedError(str(exc), "stop") from exc
        bias = body.get("logit_bias") or None
        try:
            self.logit_bias = {int(k): float(v) for k, v in bias.items()} if bias else None
        except (TypeError, ValueError, AttributeError) as exc:
            raise UnsupportedError("logit_bias keys must be token ids", "logit_bias") from exc
        self.presence_penalty = body.get("presence_penalty") or None
        self.frequency_penalty = body.get("frequency_penalty") or None
        self.repetition_penalty = body.get("repetition_penalty") or None


class MLXAdapter(Adapter):
    def __init__(self, config: EngineConfig, spec: EngineSpec) -> None:
        self.declare(spec)
        self.config = config
        self.path = config.source
        self.context_length = config.options.get("context_length")
        self.tokenizer_config = config.options.get("tokenizer_config")
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"mlx-{config.name or 'model'}")
        self._model: Any = None
        self._tokenizer: Any = None
        self._stats = StatsCounter(EngineStats(
            requests_running=0, prompt_tokens_total=0, generation_tokens_total=0, ttft_seconds_sum=0, ttft_seconds_count=0
        ))

    # -- lifecycle -------------------------------------------------------------------------

    def _load(self) -> tuple[Any, Any]:
        try:
            import mlx_lm
        except ImportError as exc:
            raise EngineError(
                f"the mlx engine needs mlx and mlx-lm, which are not installed: run `{INSTALL_HINT}`",
                status=503,
                code="engine_not_installed",
            ) from exc
        if not (Path(self.path) / "config.json").is_file():
            raise EngineError(
                f"{self.path} is not an MLX/Hugging Face model directory (no config.json): "
                "the mlx engine loads a directory with config.json, tokenizer files and *.safetensors",
                status=503,
                code="model_not_found",
            )
        model, tokenizer = mlx_lm.load(self.path, tokenizer_config=self.tokenizer_config)
        return model, tokenizer

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            self._model, self._tokenizer = await loop.run_in_executor(self._executor, self._load)
        except EngineError:
            raise
        except Exception as exc:
            raise EngineError(f"mlx_lm could not load {self.path}: {exc}", status=503) from exc
        if self.context_length is None:
            self.context_length = _trained_context(Path(self.path))

    async def stop(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._model = self._tokenizer = None

    async def health(self) -> Health:
        loaded = self._model is not None
        return Health(ready=loaded, detail="" if loaded else "not loaded")

    async def engine_stats(self) -> EngineStats:
        return self._stats.snapshot()

    def describe(self) -> dict[str, Any]:
        return {"path": self.path, "context_length": self.context_length}

    # -- request translation ----------------------------------------------------------------

    def _chat_tokens(self, body: dict[str, Any]) -> list[int]:
        messages = [{**m, "content": _text_content(m.get("content"))} for m in body["messages"]]
        try:
            prompt = self._tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as exc:  # jinja errors: the template rejects these messages
            raise UnsupportedError(f"the model's chat template rejected the messages: {exc}", "messages") from exc
        return list(self._tokenizer.encode(prompt, add_special_tokens=False))

    def _prompt_tokens(self, prompt: Any) -> list[int]:
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if isinstance(prompt, str):
            return list(self._tokenizer.encode(prompt))
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        raise UnsupportedError("the mlx engine takes one prompt per request: send several prompts one by one", "prompt")

    def _request(self, body: dict[str, Any], tokens: list[int], param: str) -> _Request:
        if (body.get("n") or 1) > 1:
            raise UnsupportedError("n > 1 is not supported by the mlx engine: send n separate requests", "n")
        if body.get("logprobs") or body.get("top_logprobs"):
            raise UnsupportedError("logprobs are not supported by the mlx engine", "logprobs")
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        room = int(self.context_length) - len(tokens) if self.context_length else None
        if room is not None and room <= 0:
            raise UnsupportedError(
                f"the prompt has {len(tokens)} tokens, which fills the model's context of {self.context_length} tokens", param
            )
        if limit is not None:
            if not isinstance(limit, int) or limit < 1:
                raise UnsupportedError("max_tokens must be a positive integer", "max_tokens")
            if room is not None and limit > room:
                raise UnsupportedError(
                    f"this model's context is {self.context_length} tokens; the prompt has {len(tokens)} and "
                    f"max_tokens asks for {limit} more",
                    "max_tokens",
                )
        return _Request(tokens, int(limit or room or -1), body)

    # -- operations -------------------------------------------------------------------------

    async def chat(self, body: dict[str, Any], ctx: RequestContext) -> Completion | AsyncIterator[StreamEvent]:
        self._require_loaded()
        req = self._request(body, self._chat_tokens(body), "messages")
        if body.get("stream"):
            return self._stream(req, ctx, chat=True)
        return await self._complete(req, ctx, chat=True)

    async def completions(self, body: dict[str, Any], ctx: RequestContext) -> Completion | AsyncIterator[StreamEvent]:
        self._require_loaded()
        req = self._request(body, self._prompt_tokens(body.get("prompt")), "prompt")
        if body.get("stream"):
            return self._stream(req, ctx, chat=False)
        return await self._complete(req, ctx, chat=False)

    # -- execution (worker thread) ----------------------------------------------------------

    def _generate(self, req: _Request, emit: Callable[[str], None], cancelled: threading.Event) -> _Outcome:
        import mlx.core as mx
        from mlx_lm import stream_generate
        from mlx_lm.sample_utils import make_logits_processors, make_sampler

        if req.seed is not None:
            mx.random.seed(int(req.seed))
        sampler = make_sampler(temp=req.temperature, top_p=req.top_p, min_p=req.min_p, top_k=req.top_k)
        processors = make_logits_processors(
            logit_bias=req.logit_bias,
            repetition_penalty=req.repetition_penalty,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
        )
        matcher = StopMatcher(req.stops)
        usage = Usage(prompt_tokens=len(req.tokens))
        finish: str | None = "length"
        started = time.perf_counter()
        first = True
        self._stats.bump(requests_running=1)
        generator = stream_generate(
            self._model, self._tokenizer, req.tokens, max_tokens=req.max_tokens, sampler=sampler, logits_processors=processors
        )
        try:
            for result in generator:
                if first:
                    first = False
                    self._stats.bump(ttft_seconds_sum=time.perf_counter() - started, ttft_seconds_count=1)
                if cancelled.is_set():
                    finish = None
                    break
                eos = result.finish_reason == "stop"  # stream_generate counts the EOS token; OpenAI does not
                usage.completion_tokens = result.generation_tokens - (1 if eos else 0)
                text = matcher.feed(result.text)
                if text:
                    emit(text)
                if matcher.stopped:
                    finish = "stop"
                    break
                if result.finish_reason:
                    finish = result.finish_reason
            tail = matcher.flush()
            if tail and finish is not None:
                emit(tail)
        finally:
            generator.close()
            self._stats.bump(requests_running=-1, prompt_tokens_total=usage.prompt_tokens, generation_tokens_total=usage.completion_tokens)
        return _Outcome(finish, usage)

    async def _complete(self, req: _Request, ctx: RequestContext, chat: bool) -> Completion:
        parts: list[str] = []
        loop = asyncio.get_running_loop()
        try:
            outcome = await loop.run_in_executor(self._executor, self._generate, req, parts.append, threading.Event())
        except (UnsupportedError, EngineError):
            raise
        except Exception as exc:
            raise EngineError(f"mlx generation failed: {exc}") from exc
        text = "".join(parts)
        if chat:
            choice: dict[str, Any] = {
                "index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                "finish_reason": outcome.finish_reason,
            }
            body = {"id": f"chatcmpl-{ctx.request_id}", "object": "chat.completion"}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": outcome.finish_reason}
            body = {"id": f"cmpl-{ctx.request_id}", "object": "text_completion"}
        body.update(created=int(time.time()), model=ctx.model, choices=[choice], usage=outcome.usage.as_dict())
        return Completion(body=body, usage=outcome.usage)

    async def _stream(self, req: _Request, ctx: RequestContext, chat: bool) -> AsyncIterator[StreamEvent]:
        stream = ThreadStream()
        stream.run(self._executor, lambda: stream.put(self._generate(req, stream.put, stream.cancelled)))
        prefix, obj = ("chatcmpl", "chat.completion.chunk") if chat else ("cmpl", "text_completion")
        head = {"id": f"{prefix}-{ctx.request_id}", "object": obj, "created": int(time.time()), "model": ctx.model}

        def chunk(delta: dict[str, Any] | str, finish: str | None = None) -> bytes:
            choice: dict[str, Any] = {"index": 0}
            if chat:
                choice["delta"] = delta
            else:
                choice["text"] = delta
            choice.update(logprobs=None, finish_reason=finish)
            return orjson.dumps({**head, "choices": [choice]})

        try:
            if chat:
                yield StreamEvent(data=chunk({"role": "assistant", "content": ""}))
            outcome: _Outcome | None = None
            async for item in stream.items(_engine_error):
                if isinstance(item, _Outcome):
                    outcome = item
                    continue
                yield StreamEvent(data=chunk({"content": item} if chat else item), has_content=True)
            if outcome is None:
                raise EngineError("mlx generation ended without a result")
            yield StreamEvent(data=chunk({} if chat else "", outcome.finish_reason), finish_reason=outcome.finish_reason)
            data = orjson.dumps({**head, "choices": [], "usage": outcome.usage.as_dict()}) if ctx.include_usage else b""
            yield StreamEvent(data=data, usage=outcome.usage)
        finally:
            stream.cancelled.set()
            if stream.future is not None and not stream.future.done():
                log.info("%s: stream closed early; generation cancelled", ctx.request_id)

    def _require_loaded(self) -> None:
        if self._model is None:
            raise EngineError(f"model {self.config.served} is not loaded", status=503, code="model_not_ready")


def _engine_error(exc: BaseException) -> BaseException:
    return exc if isinstance(exc, (UnsupportedError, EngineError)) else EngineError(f"mlx generation failed: {exc}")


def _number(body: dict[str, Any], key: str, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise UnsupportedError(f"{key} must be a number", key)
    return value


def _text_content(content: Any) -> str:
    """Message content as text: a string, or a list of text parts (other parts are not supported)."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise UnsupportedError(f"the mlx engine takes text only; got a {kind!r} content part", "messages")
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    raise UnsupportedError("message content must be a string or a list of text parts", "messages")


def _trained_context(path: Path) -> int | None:
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = config.get("max_position_embeddings") or config.get("max_seq_len")
    return int(value) if value else None


SPEC = EngineSpec(
    name="mlx",
    adapter=MLXAdapter,
    capabilities=Capabilities(chat=True, completions=True, embeddings=False, tools=False, structured_output=False),
    accelerators=("apple",),  # Apple silicon; its CPU / CUDA builds run only when requested (engine: mlx)
    formats=("mlx", "bf16", "fp16"),
    needs_fast_memory=False,
    tensor_parallel=False,
    paged_kv=False,
    install_hint=INSTALL_HINT,
    python_modules=("mlx", "mlx_lm"),
    layout_options=lambda lay: {"context_length": lay.context_length},
    container_image=None,  # MLX needs Apple silicon (Metal): no container runs it
)
