"""llama.cpp in-process through llama-cpp-python.

Concurrency rule: a `Llama` object is neither thread-safe nor re-entrant, so each instance
owns a single worker thread and every call on it runs there, one at a time; nothing blocks
the event loop. Streams are fed from that thread through `call_soon_threadsafe`; closing a
stream sets a flag the thread checks after every token, so generation stops within a token.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import orjson

from adapters import forced_tools, logprobs, tool_prompt
from adapters.base import (
    Adapter,
    Capabilities,
    ClientRequestError,
    Completion,
    EngineError,
    EngineStats,
    Health,
    RequestContext,
    StreamEvent,
    UnsupportedError,
    Usage,
)
from adapters.chat_shape import ToolCallDeltas, mend_completion
from adapters.config import EngineConfig
from adapters.counters import StatsCounter
from adapters.llamacpp_kv import (
    BYTES_PER_ELEMENT,
    QUANTISED,
    kv_cache_type,
    llama_kwargs,
)
from adapters.llamacpp_requests import (
    chat_logprobs_k,
    completion_logprobs_k,
    text_messages,
    translator,
)
from adapters.spec import EngineSpec, Layout
from adapters.thread_stream import ThreadStream

log = logging.getLogger("enginegate.llamacpp")

# OpenAI field -> llama-cpp-python keyword, for fields passed through unchanged.
SAMPLING_FIELDS = ("temperature", "top_p", "stop", "seed", "presence_penalty", "frequency_penalty")
# llama.cpp extras that OpenAI-compatible clients send in the body (vLLM and llama-server accept them too).
EXTRA_FIELDS = ("top_k", "min_p", "repeat_penalty", "typical_p", "mirostat_mode", "mirostat_tau", "mirostat_eta")
OPENAI_DEFAULT_TEMPERATURE = 1.0
OPENAI_DEFAULT_TOP_P = 1.0
SPLIT_MODES = {"none": 0, "layer": 1, "row": 2}
"""llama.cpp's multi-GPU split (llama-server's -sm), as llama-cpp-python's LLAMA_SPLIT_MODE_* values."""



class _TokenCounter:
    """A llama-cpp-python logits processor: counts sampled tokens, notes the prompt length and
    applies `logit_bias`. (llama-cpp-python 0.3.x drops every logits processor when it is given
    both `logit_bias` and a processor list: `list.extend` returns None there.)

    Its first call comes when the prompt is evaluated and the first token is about to be sampled:
    the engine-side time to first token, measured from the request's submission (executor wait included).
    """

    def __init__(self, logit_bias: dict[int, float] | None = None, end_token: int | None = None) -> None:
        self.prompt_tokens: int | None = None
        self.sampled = 0
        self.submitted_at = time.perf_counter()
        self.first_token_at: float | None = None
        self.bias_ids = np.array(list(logit_bias), dtype=np.intc) if logit_bias else None
        self.bias_values = np.array(list(logit_bias.values()), dtype=np.single) if logit_bias else None
        # set when nobody waits for the result: end-of-generation becomes the only choice
        self.cancelled = threading.Event()
        self.end_token = end_token
        # logprobs asked for: the k best alternatives kept per sampled token (0: the chosen token's alone)
        self.logprobs_k: int | None = None
        self.taken: list[logprobs.TokenLogprob] = []
        self._row: np.ndarray | None = None

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        if self.prompt_tokens is None:
            self.prompt_tokens = len(input_ids)
            self.first_token_at = time.perf_counter()
        self.sampled += 1
        if self.cancelled.is_set() and self.end_token is not None:
            ended = np.full_like(scores, -np.inf)
            ended[self.end_token] = 0.0
            return ended
        if self.bias_ids is not None:
            scores = scores.copy()
            scores[self.bias_ids] += self.bias_values
        if self.logprobs_k is not None:
            self._row = logprobs.log_softmax(scores)
        return scores

    def took(self, token: int) -> None:
        """The engine sampled `token` from the scores this processor saw last (called in the worker thread)."""
        if self._row is not None and self.logprobs_k is not None:
            self.taken.append(logprobs.TokenLogprob(token, float(self._row[token]), logprobs.top_k(self._row, self.logprobs_k)))
            self._row = None

    def drain(self) -> list[logprobs.TokenLogprob]:
        out, self.taken = self.taken, []
        return out


class LlamaCppAdapter(Adapter):
    def __init__(self, config: EngineConfig, spec: EngineSpec) -> None:
        self.declare(spec)
        self.config = config
        options = config.options
        self.path = config.source
        self.n_ctx = int(options.get("context_length") or 4096)
        self.n_threads = int(options.get("threads") or os.cpu_count() or 1)
        self.n_gpu_layers = int(options.get("gpu_layers") or 0)
        self.kv_cache_type = kv_cache_type(options)
        self.chat_format = config.chat_format
        self.llama_kwargs: dict[str, Any] = dict(options.get("llama_kwargs") or {})
        self.split_mode = SPLIT_MODES.get(str(options.get("split_mode") or "layer"), 1)
        self.tensor_split = [float(x) for x in options["tensor_split"]] if options.get("tensor_split") else None
        self.scoring = bool(options.get("scoring"))
        """Keep every position's logits (llama.cpp's logits_all): completions' `echo` + `logprobs` score the prompt."""
        self._executor, self._embed_executor = self._executors()
        self._llm: Any = None
        self._embedder: Any = None
        self._embed_lock = asyncio.Lock()
        self._stats = StatsCounter(EngineStats(
            requests_running=0, requests_waiting=0, prompt_tokens_total=0, generation_tokens_total=0,
            ttft_seconds_sum=0.0, ttft_seconds_count=0,
        ))
        self._started = False
        self._stopped = False
        self._tools_rendered: bool | None = None  # does the chat template render tools? (probed on first use)

    # -- lifecycle -------------------------------------------------------------------------

    def _load(self, embedding: bool = False) -> Any:
        try:
            from llama_cpp import LLAMA_POOLING_TYPE_MEAN
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise EngineError(
                "llama-cpp-python is not installed: run `make setup` (it builds llama.cpp with flags safe "
                "for this CPU), or `pip install 'enginegate[llamacpp]'`",
                status=503,
                code="engine_not_installed",
            ) from exc
        kwargs: dict[str, Any] = {
            "model_path": self.path,
            "n_ctx": self.n_ctx,
            "n_threads": self.n_threads,
            "n_threads_batch": self.n_threads,
            "n_gpu_layers": self.n_gpu_layers,
            "split_mode": self.split_mode,
            "verbose": False,
        }
        if self.tensor_split:
            kwargs["tensor_split"] = self.tensor_split
        if embedding:
            kwargs.update(embedding=True, pooling_type=LLAMA_POOLING_TYPE_MEAN)
        else:
            kwargs.update(llama_kwargs(self.kv_cache_type))
            if self.chat_format:
                kwargs["chat_format"] = self.chat_format
            if self.scoring:
                kwargs["logits_all"] = True  # prompt logprobs: the logits after every prompt token, not just the last
        kwargs.update(self.llama_kwargs)
        return _recording_llama()(**kwargs)

    def _executors(self) -> tuple[ThreadPoolExecutor, ThreadPoolExecutor]:
        return (ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"llamacpp-{self.config.name or 'model'}"),
                ThreadPoolExecutor(max_workers=1, thread_name_prefix="llamacpp-embed"))

    async def start(self) -> None:
        """Load the model; after `stop()` (an unload) it loads again, on fresh worker threads."""
        loop = asyncio.get_running_loop()
        if self._stopped:
            self._executor, self._embed_executor = self._executors()
            self._stopped = False
        try:
            self._llm = await loop.run_in_executor(self._executor, self._load)
        except EngineError:
            raise
        except Exception as exc:
            raise EngineError(f"llama.cpp could not load {self.path}: {exc}", status=503) from exc
        self._started = True

    async def stop(self) -> None:
        self._started = False
        self._stopped = True
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._embed_executor.shutdown(wait=True, cancel_futures=True)
        for llm in (self._llm, self._embedder):
            if llm is not None:
                llm.close()
        self._llm = self._embedder = None

    def memory_bytes(self) -> int | None:
        """llama.cpp's own figures: its tensors' bytes plus the KV cache its context reserves (at its KV type)."""
        llm = self._llm
        if llm is None:
            return None
        try:
            import llama_cpp

            model = llm._model.model
            layers, embd = llama_cpp.llama_model_n_layer(model), llama_cpp.llama_model_n_embd(model)
            heads, kv_heads = llama_cpp.llama_model_n_head(model), llama_cpp.llama_model_n_head_kv(model)
            kv = int(2 * layers * self.n_ctx * kv_heads * (embd // max(1, heads)) * BYTES_PER_ELEMENT[self.kv_cache_type])
            return int(llama_cpp.llama_model_size(model)) + kv + (scoring_bytes(self.n_ctx, llm.n_vocab()) if self.scoring else 0)
        except (AttributeError, ImportError, TypeError):  # an older llama-cpp-python without these calls
            return None

    async def health(self) -> Health:
        return Health(ready=self._started and self._llm is not None, detail="" if self._started else "not loaded")

    async def engine_stats(self) -> EngineStats:
        stats = self._stats.snapshot()
        llm = self._llm
        if llm is not None:  # one sequence: the KV cache holds the tokens of the current context
            stats.kv_cache_usage_ratio = min(1.0, llm.n_tokens / max(1, self.n_ctx))
        return stats

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {"path": self.path, "context_length": self.n_ctx, "threads": self.n_threads,
                                "kv_cache_type": self.kv_cache_type}
        if self._llm is not None:
            info["trained_context_length"] = self._llm._model.n_ctx_train()
            info["embedding_length"] = self._llm.n_embd()
            info["vocab_size"] = self._llm.n_vocab()
        return info

    # -- request translation ----------------------------------------------------------------

    def _sampling(self, body: dict[str, Any]) -> dict[str, Any]:
        kwargs: dict[str, Any] = {k: body[k] for k in (*SAMPLING_FIELDS, *EXTRA_FIELDS) if body.get(k) is not None}
        kwargs.setdefault("temperature", OPENAI_DEFAULT_TEMPERATURE)
        kwargs.setdefault("top_p", OPENAI_DEFAULT_TOP_P)
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        kwargs["max_tokens"] = int(limit) if limit else None  # None: until the context is full
        return kwargs

    def _counter(self, body: dict[str, Any]) -> _TokenCounter:
        raw = body.get("logit_bias")
        end = self._llm.token_eos() if self._llm is not None else None
        if not raw:
            return _TokenCounter(end_token=end)
        try:
            bias = {int(k): max(-100.0, min(100.0, float(v))) for k, v in raw.items()}
        except (TypeError, ValueError) as exc:
            raise UnsupportedError("logit_bias keys must be token ids and values numbers", "logit_bias") from exc
        n_vocab = self._llm.n_vocab() if self._llm is not None else 0
        if any(not 0 <= k < n_vocab for k in bias):
            raise UnsupportedError(f"logit_bias token ids must be in [0, {n_vocab})", "logit_bias")
        return _TokenCounter(bias, end_token=end)

    @staticmethod
    def _response_format(body: dict[str, Any]) -> dict[str, Any] | None:
        fmt = body.get("response_format")
        if not fmt or fmt.get("type") == "text":
            return None
        if fmt["type"] == "json_object":
            schema = fmt.get("schema")
            return {"type": "json_object", **({"schema": schema} if schema else {})}
        schema = (fmt.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict):
            raise UnsupportedError("response_format json_schema needs json_schema.schema", "response_format")
        return {"type": "json_object", "schema": schema}

    def _stamp(self, obj: dict[str, Any], ctx: RequestContext, prefix: str) -> dict[str, Any]:
        obj["id"] = f"{prefix}-{ctx.request_id}"
        obj["model"] = ctx.model
        return obj

    def _account(self, usage: Usage) -> None:
        self._stats.bump(prompt_tokens_total=usage.prompt_tokens)

    def _count_generated(self, n: int) -> None:
        self._stats.bump(generation_tokens_total=n)

    def _finished(self, counter: _TokenCounter) -> None:
        self._count_generated(counter.sampled)
        if counter.first_token_at is not None:
            self._stats.bump(ttft_seconds_sum=counter.first_token_at - counter.submitted_at, ttft_seconds_count=1)

    def _waiting(self, delta: int) -> None:
        self._stats.bump(requests_waiting=delta)

    def _running(self, delta: int) -> None:
        self._stats.bump(requests_running=delta)

    # -- operations -------------------------------------------------------------------------

    async def chat(self, body: dict[str, Any], ctx: RequestContext) -> Completion | AsyncIterator[StreamEvent]:
        kwargs = self._sampling(body)
        kwargs["messages"] = text_messages(body["messages"])
        fmt = self._response_format(body)
        if fmt is not None:
            kwargs["response_format"] = fmt
        for key in ("tools", "tool_choice"):
            if body.get(key) is not None:
                kwargs[key] = body[key]
        rendered = bool(kwargs.get("tools")) and kwargs.get("tool_choice") != "none" and not await self._renders_tools()
        if rendered:  # the template ignores tools: the gateway writes them into the prompt (adapters/tool_prompt)
            original = kwargs["messages"]
            kwargs["messages"] = tool_prompt.render_messages(original, tool_prompt.tools_block(kwargs["tools"]))
        if kwargs.get("tool_choice") == "required" and kwargs.get("tools"):
            kwargs["tool_choice"] = await self._required_tool(kwargs)
        answer = rendered and not isinstance(kwargs.get("tool_choice"), dict)
        if rendered and not answer:  # forced: the prompt names the one call, the grammar holds its arguments
            name = str((kwargs["tool_choice"].get("function") or {}).get("name"))
            kwargs["messages"] = tool_prompt.render_messages(original, tool_prompt.args_instruction(kwargs["tools"], name))
        if answer:  # auto: a reply or a call, in the form, held to it by the answer's schema
            if fmt is None:
                kwargs["response_format"] = {"type": "json_object", "schema": tool_prompt.answer_schema(kwargs["tools"])}
            kwargs.pop("tool_choice", None)
            kwargs.pop("tools")
        forced = self._forced_call(kwargs)
        counter = self._counter(body)
        counter.logprobs_k = chat_logprobs_k(body)
        if body.get("stream"):
            events = await self._stream(lambda: self._llm.create_chat_completion(
                stream=True, logits_processor=[counter], **kwargs), counter, ctx, "chatcmpl", "chat.completion.chunk")
            if answer:
                return tool_prompt.as_answer_stream(events)
            return events if forced is None else forced_tools.as_tool_call_stream(events, forced)
        result = await self._complete(lambda: self._with_logprobs(self._llm.create_chat_completion(
            logits_processor=[counter], **kwargs), counter), counter, ctx, "chatcmpl")
        if forced is not None:
            result = forced_tools.as_tool_call(result, forced)
        if answer:
            result = tool_prompt.as_answer(result)
        assert isinstance(result.body, dict)
        mend_completion(result.body)
        return result

    async def _renders_tools(self) -> bool:
        """Whether the model's chat template (as llama-cpp-python renders it: the GGUF's jinja template or
        the configured chat_format) writes `tools` into the prompt: a probe's prompt tokens with and
        without a tool, measured once (two one-token generations)."""
        if self._tools_rendered is None:
            self._require_loaded()

            def prompt_tokens(tools: list[dict[str, Any]] | None) -> int | None:
                try:
                    out = self._llm.create_chat_completion(messages=tool_prompt.PROBE_MESSAGES, tools=tools,
                                                           max_tokens=1, temperature=0.0)
                except Exception:
                    log.info("%s: the chat template failed on a probe with tools", self.config.served, exc_info=True)
                    return None
                return int(out["usage"]["prompt_tokens"])

            loop = asyncio.get_running_loop()
            without = await loop.run_in_executor(self._executor, lambda: prompt_tokens(None))
            with_tools = await loop.run_in_executor(self._executor, lambda: prompt_tokens(tool_prompt.PROBE_TOOLS))
            self._tools_rendered = tool_prompt.renders_tools(without, with_tools)
            log.info("%s: the chat template %s tools (probe prompt %s tokens without, %s with)", self.config.served,
                     "renders" if self._tools_rendered else "ignores", without, with_tools)
        return self._tools_rendered

    def _forced_call(self, kwargs: dict[str, Any]) -> str | None:
        """A named tool_choice on the GGUF's own template, made here rather than by llama-cpp-python: the
        answer is constrained to the function's parameters (its JSON schema as a grammar) and becomes the
        call, keeping the engine's finish reason. llama-cpp-python's own forced call always says
        `tool_calls`, so a call cut by max_tokens looked finished. The tools stay in the request, for a
        template that renders them. Returns the function's name (None: not forced here)."""
        choice = kwargs.get("tool_choice")
        if self.chat_format or not isinstance(choice, dict):
            return None  # a configured chat_format (functionary, chatml-function-calling) calls tools its own way
        name = str((choice.get("function") or {}).get("name"))
        fn = forced_tools.function_of(kwargs, name)
        if fn is None:
            return None
        del kwargs["tool_choice"]
        kwargs["response_format"] = {"type": "json_object", "schema": fn.get("parameters") or {"type": "object"}}
        return name

    async def _required_tool(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """`tool_choice: "required"` as the named choice llama-cpp-python constrains by grammar: with one
        tool, that tool; with several, the model picks the name first, its output held to the names by a
        grammar (a few tokens; the prompt's KV is reused by the call that follows)."""
        options = forced_tools.names(kwargs)
        if len(options) == 1:
            return {"type": "function", "function": {"name": options[0]}}
        self._require_loaded()
        from llama_cpp import LlamaGrammar

        grammar = LlamaGrammar.from_string(forced_tools.names_grammar(options), verbose=False)
        pick = {k: v for k, v in kwargs.items() if k not in ("tool_choice", "response_format", "stream")}
        pick.update(max_tokens=forced_tools.pick_max_tokens(options), grammar=grammar)
        loop = asyncio.get_running_loop()
        try:
            out = await loop.run_in_executor(self._executor, lambda: self._llm.create_chat_completion(**pick))
        except Exception as exc:
            raise translator("chatcmpl")(exc) from exc
        picked = str(out["choices"][0]["message"].get("content") or "").strip()
        name = picked if picked in options else options[0]
        return {"type": "function", "function": {"name": name}}

    async def completions(self, body: dict[str, Any], ctx: RequestContext) -> Completion | AsyncIterator[StreamEvent]:
        kwargs = self._sampling(body)
        k = completion_logprobs_k(body)
        scoring = bool(body.get("echo")) and (k is not None or body.get("max_tokens") == 0)
        if scoring and not self.scoring:
            raise UnsupportedError(
                f"prompt logprobs (echo with logprobs, or max_tokens 0) need model {ctx.model} served with the option "
                "`scoring: true` (llama.cpp then keeps every position's logits; see docs/evaluation.md), or a vllm engine",
                "echo")
        if scoring and body.get("stream"):
            raise UnsupportedError("prompt logprobs (echo with logprobs) are not streamed by the llamacpp engine: "
                                   "send stream: false", "stream")
        if body.get("echo") and not scoring:
            kwargs["echo"] = True
        prompts = _prompts(body["prompt"])
        if body.get("stream"):
            if len(prompts) > 1:
                raise UnsupportedError("streaming several prompts at once is not supported: send them one by one", "prompt")
            counter = self._counter(body)
            counter.logprobs_k = k
            return await self._stream(lambda: self._llm.create_completion(
                prompts[0], stream=True, logits_processor=[counter], **kwargs), counter, ctx, "cmpl", "text_completion")
        results = []
        for prompt in prompts:
            counter = self._counter(body)
            counter.logprobs_k = k
            if scoring:
                limit = 0 if body.get("max_tokens") == 0 else kwargs["max_tokens"]
                call: Callable[[], dict[str, Any]] = (
                    lambda p=prompt, c=counter, n=limit: self._score(p, c, {**kwargs, "max_tokens": n}))
            else:
                call = lambda p=prompt, c=counter: self._with_logprobs(
                    self._llm.create_completion(p, logits_processor=[c], **kwargs), c,
                    start=len(p) if isinstance(p, str) and not body.get("echo") else 0)
            results.append(await self._complete(call, counter, ctx, "cmpl"))
        if len(results) == 1:
            return results[0]
        merged = results[0].body
        assert isinstance(merged, dict)
        usage = Usage()
        choices = []
        for i, r in enumerate(results):
            assert isinstance(r.body, dict) and r.usage is not None
            for choice in r.body["choices"]:
                choices.append({**choice, "index": i})
            usage.prompt_tokens += r.usage.prompt_tokens
            usage.completion_tokens += r.usage.completion_tokens
        merged["choices"] = choices
        merged["usage"] = usage.as_dict()
        return Completion(body=merged, usage=usage)

    async def embeddings(self, body: dict[str, Any], ctx: RequestContext) -> Completion:
        if not self.config.embeddings:
            raise UnsupportedError(f"embeddings are switched off for model {ctx.model}")
        if body.get("dimensions"):
            raise UnsupportedError("dimensions is not supported by the llamacpp engine", "dimensions")
        loop = asyncio.get_running_loop()
        async with self._embed_lock:
            if self._embedder is None:
                self._embedder = await loop.run_in_executor(self._embed_executor, lambda: self._load(embedding=True))
        inputs = body["input"]
        if isinstance(inputs, list) and inputs and not isinstance(inputs[0], str):
            raise UnsupportedError("token-id input is not supported by the llamacpp engine's embeddings: send text", "input")
        try:
            result = await loop.run_in_executor(self._embed_executor, lambda: self._embed(inputs))
        except ClientRequestError:
            raise
        except ValueError as exc:
            raise UnsupportedError(str(exc), "input") from exc
        except Exception as exc:
            raise EngineError(f"llama.cpp embedding failed: {exc}") from exc
        as_base64 = body.get("encoding_format") == "base64"
        for item in result["data"]:
            if as_base64:
                item["embedding"] = base64.b64encode(np.asarray(item["embedding"], dtype="<f4").tobytes()).decode()
        result["model"] = ctx.model
        usage = Usage(prompt_tokens=result["usage"]["prompt_tokens"])
        self._account(usage)
        result["usage"] = {"prompt_tokens": usage.prompt_tokens, "total_tokens": usage.prompt_tokens}
        return Completion(body=result, usage=usage)

    def _embed(self, inputs: str | list[str]) -> dict[str, Any]:
        """A text the tokenizer turns into no token at all (control characters alone, for SmolLM2)
        would make llama_decode fail: it is the client's input, so it is refused as such."""
        texts = [inputs] if isinstance(inputs, str) else inputs
        context = self._embedder.n_ctx()
        for i, text in enumerate(texts):
            tokens = self._embedder.tokenize(text.encode("utf-8", "ignore"), add_bos=False, special=False)
            where = "input" if isinstance(inputs, str) else f"input[{i}]"
            if not tokens:
                raise ClientRequestError(f"{where} has no token for this model's tokenizer", param="input")
            if len(tokens) >= context:
                raise ClientRequestError(f"{where}: {len(tokens)} tokens do not fit the model's context of {context} tokens",
                                         param="input", code="context_length_exceeded")
        return self._embedder.create_embedding(inputs)

    # -- the tokenizer (vLLM's routes; llama.cpp's vocabulary is read-only, so no worker thread) ------

    def _template(self) -> str | None:
        return (self._llm.metadata or {}).get("tokenizer.chat_template") if self._llm is not None else None

    def _token_text(self, token: int) -> str | None:
        return None if token < 0 else self._llm._model.token_get_text(token)

    async def tokenize(self, body: dict[str, Any], ctx: RequestContext) -> Completion:
        self._require_loaded()
        llm = self._llm
        messages = body.get("messages")
        if messages is not None:
            template = self._template()
            if not template:
                raise UnsupportedError(f"model {ctx.model} has no chat template to render messages with", "messages")
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            eos, bos = llm.token_eos(), llm.token_bos()
            formatter = Jinja2ChatFormatter(template, eos_token=self._token_text(eos) or "", bos_token=self._token_text(bos) or "",
                                            add_generation_prompt=bool(body.get("add_generation_prompt", True)))
            text = formatter(messages=text_messages(messages)).prompt
            special = bool(body.get("add_special_tokens", False))
        else:
            text = str(body.get("prompt", ""))
            special = bool(body.get("add_special_tokens", True))
        tokens = llm.tokenize(text.encode("utf-8"), add_bos=special, special=True)
        out: dict[str, Any] = {"count": len(tokens), "max_model_len": self.n_ctx, "tokens": tokens}
        if body.get("return_token_strs"):
            out["token_strs"] = [self._text(t) for t in tokens]
        return Completion(body=out)

    async def detokenize(self, body: dict[str, Any], ctx: RequestContext) -> Completion:
        self._require_loaded()
        tokens = [int(t) for t in body.get("tokens") or []]
        n_vocab = self._llm.n_vocab()
        if any(not 0 <= t < n_vocab for t in tokens):
            raise UnsupportedError(f"token ids must be in [0, {n_vocab})", "tokens")
        return Completion(body={"prompt": self._llm.detokenize(tokens).decode("utf-8", "replace")})

    async def tokenizer_info(self, ctx: RequestContext) -> Completion:
        self._require_loaded()
        llm = self._llm
        return Completion(body={
            "tokenizer_class": "llama.cpp", "model_max_length": self.n_ctx, "vocab_size": llm.n_vocab(),
            "bos_token": self._token_text(llm.token_bos()), "eos_token": self._token_text(llm.token_eos()),
            "pad_token": None, "chat_template": self._template(),
        })

    # -- logprobs (run in the worker thread) ---------------------------------------------------

    def _piece(self, token: int) -> bytes:
        return bytes(self._llm.detokenize([token]))

    def _generated(self, counter: _TokenCounter, text: str | None) -> list[logprobs.TokenLogprob]:
        """The tokens the engine sampled for this answer: end-of-generation tokens dropped, and, when the
        engine cut the text (a stop sequence), those past its end."""
        import llama_cpp

        vocab = self._llm._model.vocab
        items = [i for i in counter.drain() if not llama_cpp.llama_vocab_is_eog(vocab, i.token)]
        if text is not None:
            items = items[:logprobs.keep_within(items, [self._text(i.token) for i in items], len(text))]
        return items

    def _text(self, token: int) -> str:
        return self._piece(token).decode("utf-8", "replace")

    def _legacy(self, items: list[logprobs.TokenLogprob], start: int = 0) -> dict[str, Any]:
        alts = {i: self._text(i) for item in items for i, _ in item.top}
        return logprobs.legacy(items, [self._text(i.token) for i in items], alts, start)

    def _chat(self, items: list[logprobs.TokenLogprob], k: int) -> dict[str, Any]:
        alts = {i: self._piece(i) for item in items for i, _ in item.top}
        return logprobs.chat(items, [self._piece(i.token) for i in items], alts, k)

    def _with_logprobs(self, result: dict[str, Any], counter: _TokenCounter, start: int = 0) -> dict[str, Any]:
        """The answer with the sampled tokens' logprobs in its API's shape, when they were asked for."""
        if counter.logprobs_k is None:
            return result
        choice = result["choices"][0]
        if "message" in choice:
            items = self._generated(counter, choice["message"].get("content"))
            choice["logprobs"] = self._chat(items, counter.logprobs_k)
        else:
            choice["logprobs"] = self._legacy(self._generated(counter, choice.get("text")), start)
        return result

    def _stream_logprobs(self, chunk: dict[str, Any], counter: _TokenCounter) -> None:
        """A stream chunk carries the logprobs of the tokens sampled since the previous chunk."""
        if counter.logprobs_k is None or not chunk.get("choices"):
            return
        choice = chunk["choices"][0]
        items = self._generated(counter, None)
        if not items and not (choice.get("text") or (choice.get("delta") or {}).get("content")):
            return
        if "delta" in choice:
            choice["logprobs"] = self._chat(items, counter.logprobs_k)
        else:
            choice["logprobs"] = self._legacy(items)

    def _score(self, prompt: str | list[int], counter: _TokenCounter, kwargs: dict[str, Any]) -> dict[str, Any]:
        """`echo` with `logprobs`: every prompt token's logprob (the first null), then, unless `max_tokens`
        is 0 (score only), the generated continuation with its own. The prompt's common prefix with the
        previous request is not computed again (its logits are kept: logits_all)."""
        llm = self._llm
        tokens = list(prompt) if isinstance(prompt, list) else llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
        if len(tokens) + max(0, kwargs.get("max_tokens") or 0) > self.n_ctx:
            raise ClientRequestError(f"the prompt's {len(tokens)} tokens (+ max_tokens) exceed the context of {self.n_ctx} tokens",
                                     param="prompt", code="context_length_exceeded")
        cached = _common_prefix(llm.input_ids[: llm.n_tokens], tokens)
        if llm._is_recurrent or llm._is_hybrid or cached >= len(tokens):
            cached = 0 if llm._is_recurrent or llm._is_hybrid else len(tokens) - 1
        if cached == 0:
            llm.reset()
        llm.n_tokens = cached
        llm.eval(tokens[cached:])
        k = counter.logprobs_k or 0
        items = logprobs.score(tokens, llm.scores[: len(tokens)], k)
        text = prompt if isinstance(prompt, str) else llm.detokenize(tokens).decode("utf-8", "replace")
        generated, finish, completion_tokens = "", "length", 0
        if kwargs.get("max_tokens") != 0:
            counter.logprobs_k = k
            out = llm.create_completion(tokens, logits_processor=[counter], **kwargs)
            choice = out["choices"][0]
            generated, finish = choice["text"], choice["finish_reason"]
            completion_tokens = out["usage"]["completion_tokens"]
            # every sampled token, an end token included: scorers slice the echo by position (lm-eval drops the last)
            items += counter.drain()
        return {
            "object": "text_completion", "created": int(time.time()),
            "choices": [{"text": text + generated, "index": 0, "finish_reason": finish,
                         "logprobs": self._legacy(items) if counter.logprobs_k is not None else None}],
            "usage": {"prompt_tokens": len(tokens), "completion_tokens": completion_tokens,
                      "total_tokens": len(tokens) + completion_tokens},
        }

    # -- execution -------------------------------------------------------------------------

    async def _complete(self, call: Callable[[], dict[str, Any]], counter: _TokenCounter, ctx: RequestContext, prefix: str) -> Completion:
        """Run `call` in the worker; cancelled (client gone), a queued call never runs, a running one stops."""
        self._require_loaded()
        stream = ThreadStream()

        def work() -> None:
            self._running(+1)
            self._llm.on_sample = counter.took
            try:
                stream.put(call())
            finally:
                self._llm.on_sample = None
                self._running(-1)
                self._finished(counter)

        self._waiting(+1)
        stream.run(self._executor, work, on_dequeue=lambda: self._waiting(-1))
        result: dict[str, Any] = {}
        try:
            async for item in stream.items(translator(prefix)):
                result = item
        finally:
            stream.cancelled.set()
            counter.cancelled.set()
        raw = result.get("usage") or {}
        usage = Usage(prompt_tokens=raw.get("prompt_tokens", 0), completion_tokens=raw.get("completion_tokens", 0))
        self._account(usage)
        return Completion(body=self._stamp(result, ctx, prefix), usage=usage)

    async def _stream(
        self,
        call: Callable[[], Iterator[dict[str, Any]]],
        counter: _TokenCounter,
        ctx: RequestContext,
        prefix: str,
        chunk_object: str,
    ) -> AsyncIterator[StreamEvent]:
        self._require_loaded()
        stream = ThreadStream()

        def work() -> None:
            self._running(+1)
            self._llm.on_sample = counter.took
            chunks: Iterator[dict[str, Any]] | None = None
            try:
                chunks = call()
                for chunk in chunks:
                    if stream.cancelled.is_set():
                        log.info("%s: generation cancelled after %d tokens (client disconnected)", ctx.request_id, counter.sampled)
                        break
                    self._stream_logprobs(chunk, counter)
                    stream.put(chunk)
            finally:
                self._llm.on_sample = None
                if chunks is not None and hasattr(chunks, "close"):
                    chunks.close()
                self._running(-1)
                self._finished(counter)

        self._waiting(+1)
        stream.run(self._executor, work, on_dequeue=lambda: self._waiting(-1))
        return self._events(stream, counter, ctx, prefix, chunk_object)

    async def _events(
        self,
        stream: ThreadStream,
        counter: _TokenCounter,
        ctx: RequestContext,
        prefix: str,
        chunk_object: str,
    ) -> AsyncIterator[StreamEvent]:
        stream_id = f"{prefix}-{ctx.request_id}"
        created = int(time.time())
        finish_reason: str | None = None
        tool_deltas = ToolCallDeltas() if prefix == "chatcmpl" else None

        try:
            async for item in stream.items(translator(prefix)):
                item["id"] = stream_id
                item["model"] = ctx.model
                if tool_deltas is not None:
                    tool_deltas.mend(item)
                choice = item["choices"][0] if item.get("choices") else {}
                finish_reason = choice.get("finish_reason") or finish_reason
                delta = choice.get("delta") or {}
                has_content = bool(delta.get("content") or delta.get("tool_calls") or choice.get("text"))
                yield StreamEvent(
                    data=orjson.dumps(item), has_content=has_content, finish_reason=choice.get("finish_reason")
                )
            completion_tokens = counter.sampled - (1 if finish_reason == "stop" and counter.sampled else 0)
            usage = Usage(prompt_tokens=counter.prompt_tokens or 0, completion_tokens=completion_tokens)
            self._account(usage)
            data = b""
            if ctx.include_usage:
                data = orjson.dumps(
                    {"id": stream_id, "object": chunk_object, "created": created, "model": ctx.model,
                     "choices": [], "usage": usage.as_dict()}
                )
            yield StreamEvent(data=data, usage=usage)
        finally:
            stream.cancelled.set()

    def _require_loaded(self) -> None:
        if self._llm is None:
            raise EngineError(f"model {self.config.served} is not loaded", status=503, code="model_not_ready")


def _recording_llama() -> type:
    """llama-cpp-python's `Llama` telling a hook each token it samples (the logprobs recorder's other half:
    its logits processor sees the scores, never the choice)."""
    from llama_cpp import Llama

    class RecordingLlama(Llama):  # type: ignore[misc]
        on_sample: Callable[[int], None] | None = None

        def sample(self, *args: Any, **kwargs: Any) -> int:
            token = int(super().sample(*args, **kwargs))
            if self.on_sample is not None:
                self.on_sample(token)
            return token

    return RecordingLlama


def scoring_bytes(n_ctx: int, n_vocab: int) -> int:
    """What `scoring: true` (logits_all) costs: llama.cpp's output buffer and llama-cpp-python's copy,
    float32 logits for every position of the context."""
    return 2 * 4 * n_ctx * n_vocab


def _common_prefix(held: Any, tokens: list[int]) -> int:
    n = min(len(held), len(tokens))
    for i in range(n):
        if int(held[i]) != tokens[i]:
            return i
    return n


def _prompts(prompt: Any) -> list[Any]:
    if isinstance(prompt, str):
        return [prompt]
    if prompt and isinstance(prompt[0], int):
        return [prompt]
    return list(prompt)



def layout_options(lay: Layout) -> dict[str, Any]:
    """What the in-process engine reads (`parallel`: the requests the gateway lets through at once)."""
    options: dict[str, Any] = {"context_length": lay.context_length, "threads": lay.threads,
                               "gpu_layers": lay.gpu_layers, "parallel": lay.concurrency}
    if lay.gpus > 1:
        options["split_mode"] = "layer"  # llama.cpp splits by layers across GPUs (a pipeline), never tensor parallel
    if lay.kv_dtype in QUANTISED:
        options["kv_cache_type"] = lay.kv_dtype  # type_k/type_v with flash attention (adapters/llamacpp_kv.py)
    return options


SPEC = EngineSpec(
    name="llamacpp",
    adapter=LlamaCppAdapter,
    capabilities=Capabilities(chat=True, completions=True, embeddings=True, tools=True, structured_output=True,
                              logprobs=True),
    accelerators=("none", "nvidia", "amd", "apple"),
    formats=("gguf",),
    needs_fast_memory=False,  # keeps the layers that do not fit in RAM (-ngl)
    tensor_parallel=False,  # several GPUs split the layers (-sm layer)
    partial_offload=True,
    paged_kv=False,
    install_hint="pip install llama-cpp-python  (or: make setup, which picks safe CPU flags)",
    python_modules=("llama_cpp",),
    layout_options=layout_options,
    quantized_kv="q8_0",  # type_k/type_v q8_0 with flash attention, where fp16 KV pushes layers off the GPU
)
