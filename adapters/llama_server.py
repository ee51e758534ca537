"""llama.cpp's `llama-server`, launched and supervised by the gateway (engine name `llama_server`).

Use it for concurrency: its slots (`-np`) batch concurrent requests continuously. The in-process
`llamacpp` adapter is simpler (no binary to build, no port) but generates for one request at a
time. Embeddings run in a second llama-server in `--embeddings` mode (that flag restricts a
server to embeddings), started on the first embeddings request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import orjson

from adapters import forced_tools, llamacpp, logprobs, lora, tool_prompt
from adapters.base import (
    Capabilities,
    ClientRequestError,
    Completion,
    EngineError,
    RequestContext,
    StreamEvent,
    UnsupportedError,
)
from adapters.config import EngineConfig
from adapters.launch import LaunchConfigError, strings
from adapters.openai_http import UpstreamConnectionError
from adapters.paths import bin_dir
from adapters.process import (
    Endpoint,
    Launch,
    ManagedProcess,
    ProcessError,
    ProcessState,
)
from adapters.server import ROUTES, ServerAdapter
from adapters.spec import EngineSpec, Features, Layout, ServerSpec

BINARY = "llama-server"
MMPROJ_FLAGS = frozenset({"--mmproj", "-mm", "--mmproj-url", "-mmu", "-hf", "--hf-repo"})
"""llama-server reads images and audio only with a multimodal projector (-hf may fetch one)."""
KV_CACHE_TYPES = frozenset({"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"})


def find_llama_server(configured: str | None) -> Path | None:
    """Config (`options.binary`) first, then PATH, then the cache `enginegate engines install` fills."""
    if configured:
        path = Path(configured).expanduser()
        return path if path.is_file() else None
    on_path = shutil.which(BINARY)
    if on_path:
        return Path(on_path)
    cached = bin_dir() / BINARY
    return cached if cached.is_file() else None


def model_file(source: str) -> Path:
    path = Path(source).expanduser()
    if not path.is_file():
        raise EngineError(f"llama-server needs a local GGUF file; not found: {source}", 503, "model_not_found")
    return path


def launch_args(binary: Path, model_path: Path, served: str, options: Mapping[str, Any], endpoint: Endpoint,
                embeddings: bool = False) -> list[str]:
    """The llama-server command line for these options (plan + config)."""
    argv = [str(binary), "-m", str(model_path), "--host", endpoint.host, "--port", str(endpoint.port),
            "-a", served, "--metrics", "--no-webui"]
    if options.get("context_length"):
        argv += ["-c", str(int(options["context_length"]))]
    if options.get("threads"):
        argv += ["-t", str(int(options["threads"]))]
    if options.get("gpu_layers"):
        argv += ["-ngl", str(int(options["gpu_layers"]))]
    if embeddings:
        argv += ["--embeddings", "--pooling", str(options.get("pooling", "mean"))]
    elif options.get("parallel"):
        argv += ["-np", str(int(options["parallel"]))]
    kv = options.get("kv_cache_type")
    if kv:
        if kv not in KV_CACHE_TYPES:
            raise EngineError(f"unknown kv_cache_type {kv!r}; one of {', '.join(sorted(KV_CACHE_TYPES))}", 503)
        argv += ["-ctk", kv, "-ctv", kv]
    argv += feature_args(options)
    if not embeddings:
        adapters = lora.lora_adapters(options)
        try:
            if adapters and lora.runtime_loading(options):
                raise ValueError("llama-server loads every LoRA adapter at start and selects one by each request's "
                                 "scales: lora_loading runtime is vLLM's and SGLang's")
        except ValueError as exc:
            raise EngineError(str(exc), 503, "invalid_engine_options") from exc
        argv += lora.llama_server_args(adapters)
    if options.get("split_mode"):
        argv += ["-sm", str(options["split_mode"])]
    if options.get("tensor_split"):
        argv += ["-ts", ",".join(str(x) for x in options["tensor_split"])]
    try:
        extra = strings(options, "extra_args")
    except LaunchConfigError as exc:
        raise EngineError(str(exc), 503, "invalid_engine_options") from exc
    return argv + list(extra)


SPEC_TYPES = frozenset({"none", "ngram-mod", "ngram-simple", "ngram-cache", "ngram-map-k", "ngram-map-k4v", "draft-simple",
                        "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark"})
"""`--spec-type` values this llama-server accepts (its --help; a comma list of them is accepted too)."""


def feature_args(options: Mapping[str, Any]) -> list[str]:
    """The engine's own speed-ups: speculation, prompt caches, batch sizes (see `feature_options`).

    A draft model the user names (`draft_model`, -md) replaces the planned n-gram speculation:
    llama-server then reads the draft's type from its GGUF."""
    argv: list[str] = []
    draft = options.get("draft_model")
    spec_type = str(options.get("spec_type") or "none")
    if draft:
        argv += ["-md", str(draft)]
        if spec_type.startswith("draft-"):
            argv += ["--spec-type", spec_type]
    elif spec_type != "none":
        unknown = set(spec_type.split(",")) - SPEC_TYPES
        if unknown:
            raise EngineError(f"unknown spec_type {spec_type!r}; one of {', '.join(sorted(SPEC_TYPES))}", 503,
                              "invalid_engine_options")
        argv += ["--spec-type", spec_type]
    for option, name in (("cache_ram_mib", "--cache-ram"), ("cache_reuse", "--cache-reuse"),
                         ("batch_size", "-b"), ("ubatch_size", "-ub")):
        value = options.get(option)
        if value is not None and not isinstance(value, bool):
            argv += [name, str(int(value))]
    return argv


def launch_env(endpoint: Endpoint) -> dict[str, str]:
    """The per-launch key goes in the environment: argv is world-readable in /proc, environ is not."""
    return {"LLAMA_API_KEY": endpoint.api_key} if endpoint.api_key else {}


def multimodal(options: Mapping[str, Any]) -> bool:
    """Whether this launch gives llama-server a multimodal projector (`--mmproj` in `options.extra_args`)."""
    try:
        words = strings(options, "extra_args")
    except LaunchConfigError:
        return False  # the launch itself reports it
    return any(w.split("=", 1)[0] in MMPROJ_FLAGS for w in words)


def missing_binary(spec: EngineSpec, options: Mapping[str, Any]) -> str | None:
    if find_llama_server(options.get("binary")) is not None:
        return None
    where = options.get("binary") or "PATH or the cache"
    return f"llama-server not found in {where}; build it: {spec.install_hint}"


class LlamaServerAdapter(ServerAdapter):
    def __init__(self, config: EngineConfig, spec: EngineSpec) -> None:
        super().__init__(config, spec)
        self._embedder: ManagedProcess | None = None
        self._tools_rendered: bool | None = None  # does the chat template render tools? (probed on first use)
        self._embedder_lock = asyncio.Lock()
        if not multimodal(self.options):  # text only: images and audio are refused before they are sent
            self.capabilities = dataclasses.replace(self.capabilities, image_input=False, audio_input=False)

    def _binary(self) -> Path:
        binary = find_llama_server(self.options.get("binary"))
        if binary is None:
            raise ProcessError(missing_binary(self.spec, self.options) or "llama-server not found")
        return binary

    def launch(self, endpoint: Endpoint) -> Launch:
        argv = launch_args(self._binary(), model_file(self.config.source), self.served, self.options, endpoint)
        return Launch(argv, env=launch_env(endpoint))

    def _launch_embedder(self, endpoint: Endpoint) -> Launch:
        source = str(self.options.get("embedding_model") or self.config.source)
        argv = launch_args(self._binary(), model_file(source), self.served, self.options, endpoint, embeddings=True)
        return Launch(argv, env=launch_env(endpoint))

    async def start(self) -> None:
        model_file(self.config.source)
        missing = self.spec.why_missing(self.options)
        if missing is not None:
            raise EngineError(missing, 503, "engine_not_installed")
        await super().start()

    async def stop(self) -> None:
        try:
            if self._embedder is not None:
                await self._embedder.stop()
        finally:
            await super().stop()

    async def embeddings(self, body: dict[str, Any], ctx: RequestContext) -> Completion:
        if not self.config.embeddings:
            raise EngineError(f"embeddings are switched off for {self.served}", 503, "embeddings_disabled")
        async with self._embedder_lock:
            if self._embedder is None:
                self._embedder = self._new_process(self._launch_embedder, role="embed")
            if self._embedder.state in (ProcessState.STOPPED, ProcessState.FAILED):
                try:
                    await self._embedder.start()
                except ProcessError as exc:
                    raise EngineError(str(exc), 503, "engine_start_failed") from exc
        result = await self._forward(ROUTES["embeddings"], {**body, "stream": False}, ctx, self._embedder)
        assert isinstance(result, Completion)
        return result

    async def chat(self, body: dict[str, Any], ctx: RequestContext) -> Completion | AsyncIterator[StreamEvent]:
        """A forced tool_choice is made by the JSON schema of the function's parameters (llama-server's
        own tool calls depend on the model's chat template and ignore `required` for many: SmolLM2's)."""
        tools = body.get("tools")
        rendered = bool(tools) and body.get("tool_choice") != "none" and not await self._renders_tools(ctx)
        if rendered and body.get("tool_choice") in (None, "auto"):
            return await self._answer_chat(body, ctx)
        if not tools or body.get("tool_choice") in (None, "auto", "none"):
            return await super().chat(body, ctx)
        asked = {**body, "messages": tool_prompt.render_messages(body["messages"], tool_prompt.tools_block(tools))} \
            if rendered else body
        fn = forced_tools.forced_function(body)
        if fn is None and forced_tools.needs_pick(body):
            picked = await super().chat(forced_tools.pick_request(asked), ctx)
            assert isinstance(picked, Completion)
            fn = forced_tools.function_of(body, forced_tools.picked_name(picked, body))
        if fn is None:
            return await super().chat(body, ctx)  # a name not in tools: the engine's own 400
        name = str(fn.get("name"))
        if rendered:
            asked = {**body, "messages": tool_prompt.render_messages(body["messages"],
                                                                     tool_prompt.args_instruction(tools, name))}
        result = await super().chat(forced_tools.schema_request(asked, fn), ctx)
        if isinstance(result, Completion):
            return forced_tools.as_tool_call(result, name)
        return forced_tools.as_tool_call_stream(result, name)

    async def _answer_chat(self, body: dict[str, Any], ctx: RequestContext) -> Completion | AsyncIterator[StreamEvent]:
        """`tool_choice: auto` on a template that ignores tools: the tools in the prompt (adapters/tool_prompt),
        the answer held to "a reply or a call" by llama-server's json_schema (unless the client set a format)."""
        tools = body["tools"]
        plain = {k: v for k, v in body.items() if k not in ("tools", "tool_choice", "parallel_tool_calls")}
        plain["messages"] = tool_prompt.render_messages(body["messages"], tool_prompt.tools_block(tools))
        if not body.get("response_format"):
            plain["response_format"] = {"type": "json_schema",
                                        "json_schema": {"name": "answer", "schema": tool_prompt.answer_schema(tools)}}
        result = await super().chat(plain, ctx)
        if isinstance(result, Completion):
            return tool_prompt.as_answer(result)
        return tool_prompt.as_answer_stream(result)

    async def _renders_tools(self, ctx: RequestContext) -> bool:
        """Whether the model's chat template, as llama-server applies it (/apply-template), writes `tools`
        into the prompt: a probe rendered with and without a tool, once."""
        if self._tools_rendered is None:
            upstream = await self._upstream()

            async def prompt(tools: list[dict[str, Any]] | None) -> str | None:
                probe: dict[str, Any] = {"messages": tool_prompt.PROBE_MESSAGES, **({"tools": tools} if tools else {})}
                try:
                    result = await self.relay.complete(upstream, "/apply-template", probe, ctx)
                except (EngineError, ClientRequestError, UnsupportedError):  # a template that fails on tools
                    return None
                data = orjson.loads(result.body) if isinstance(result.body, bytes) else result.body
                text = data.get("prompt") if isinstance(data, dict) else None
                return text if isinstance(text, str) else None

            without = await prompt(None)
            if without is None:  # the route itself failed (an engine too old, or not serving): ask again later
                return True
            self._tools_rendered = tool_prompt.renders_tools(without, await prompt(tool_prompt.PROBE_TOOLS))
        return self._tools_rendered

    def select_lora(self, body: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        """Every adapter file with its scale for this request: the asked adapter's, 0 for the others (and
        for the base), since llama-server applies an adapter left out at its global scale."""
        selection = lora.llama_server_selection(self.loras, ctx.model)
        return body if selection is None else {**body, "lora": selection}

    async def completions(self, body: dict[str, Any], ctx: RequestContext) -> Completion | AsyncIterator[StreamEvent]:
        """llama-server has no `echo` (so no prompt logprobs), and answers completions' `logprobs` in chat's
        shape: mapped to the legacy one (tokens, token_logprobs, top_logprobs, text_offset)."""
        if body.get("echo"):
            raise UnsupportedError(
                "echo (and the prompt logprobs scoring reads from it) is not supported by the llama-server engine: "
                "serve the model with engine llamacpp and the option `scoring: true`, or with vllm", "echo")
        result = await super().completions(body, ctx)
        k = body.get("logprobs")
        if k is None or k is False:
            return result
        if isinstance(result, Completion):
            if result.status < 400:
                result.body = _legacy_logprobs(result.body, int(k))
            return result
        return _legacy_stream(result, int(k))

    async def tokenize(self, body: dict[str, Any], ctx: RequestContext) -> Completion:
        if body.get("messages") is not None:
            raise UnsupportedError("the llama-server engine tokenizes text only: send prompt", "messages")
        raw = await self._native("/tokenize", {"content": str(body.get("prompt", "")),
                                               "add_special": bool(body.get("add_special_tokens", True))}, ctx)
        tokens = [int(t) for t in raw.get("tokens", [])]
        context = self.options.get("context_length")
        return Completion(body={"count": len(tokens), "max_model_len": int(context) if context else None, "tokens": tokens})

    async def detokenize(self, body: dict[str, Any], ctx: RequestContext) -> Completion:
        raw = await self._native("/detokenize", {"tokens": [int(t) for t in body.get("tokens") or []]}, ctx)
        return Completion(body={"prompt": str(raw.get("content", ""))})

    async def _native(self, path: str, body: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        result = await self._forward(path, body, ctx)
        assert isinstance(result, Completion)
        raw = result.body if isinstance(result.body, dict) else orjson.loads(result.body)
        if result.status >= 400:
            raise EngineError(f"llama-server {path} failed: {raw}", status=502)
        return raw  # type: ignore[no-any-return]

    async def props(self) -> bytes | None:
        """llama-server's /props (its slot count, context, model), or None while it does not serve."""
        if self.process.state is not ProcessState.READY:
            return None
        try:
            status, raw = await self.relay.get(await self._upstream(), "/props", timeout=5.0)
        except (UpstreamConnectionError, OSError, TimeoutError, EngineError):
            return None
        return raw if status == 200 else None

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info["embedder"] = self._embedder.state.value if self._embedder is not None else "not started"
        if self.options.get("context_length"):  # the model's own limit, which the gateway checks requests against
            info["context_length"] = int(self.options["context_length"])
        return info


def _legacy_logprobs(body: dict[str, Any] | bytes, k: int) -> dict[str, Any] | bytes:
    data = body if isinstance(body, dict) else orjson.loads(body)
    for choice in data.get("choices") or []:
        lp = choice.get("logprobs")
        if isinstance(lp, dict) and "content" in lp:
            choice["logprobs"] = logprobs.legacy_from_chat(lp["content"] or [], k)
    return data if isinstance(body, dict) else orjson.dumps(data)


async def _legacy_stream(events: AsyncIterator[StreamEvent], k: int) -> AsyncIterator[StreamEvent]:
    async for event in events:
        if event.data and not event.is_error and b'"logprobs"' in event.data:
            event.data = _legacy_logprobs(event.data, k)  # type: ignore[assignment]
        yield event


KV_CACHE_TYPE = {"fp16": "f16", "bf16": "bf16", "fp8": "q8_0", "q8_0": "q8_0", "q4_0": "q4_0"}
"""The planner's KV dtype in llama.cpp's cache types (-ctk/-ctv)."""


def layout_options(lay: Layout) -> dict[str, Any]:
    """In-process llama.cpp's options, plus what only the server reads (its KV cache type)."""
    return {**llamacpp.layout_options(lay), "kv_cache_type": KV_CACHE_TYPE[lay.kv_dtype]}


CACHE_REUSE_TOKENS = 256
"""--cache-reuse: the smallest chunk llama-server shifts into place to reuse a cached prefix."""
NGRAM_SPEC_TYPE = "ngram-simple"
"""The n-gram mode the planner turns on: on edits of unseen text it beat ngram-mod (1.19x against 1.08x tokens
per CPU-second at 1 stream, benchmarks/engine_features.py); ngram-mod's table pays where requests repeat each other."""


def feature_options(f: Features) -> dict[str, Any]:
    """The planner's features in llama-server's options (flags in `feature_args`)."""
    options: dict[str, Any] = {}
    if f.speculation is not None:
        options["spec_type"] = NGRAM_SPEC_TYPE if f.speculation == "ngram" else "none"
    if f.prefix_cache:
        options["cache_reuse"] = CACHE_REUSE_TOKENS
    if f.prompt_cache_bytes is not None:
        options["cache_ram_mib"] = f.prompt_cache_bytes // 2**20
    if f.batch_tokens is not None:
        options["batch_size"] = f.batch_tokens
    if f.ubatch_tokens is not None:
        options["ubatch_size"] = f.ubatch_tokens
    return options


def slots_pay(options: Mapping[str, Any]) -> bool:
    """A request sent to a slot by `id_slot` bypasses llama-server's host-RAM prompt cache: the slot's old
    prompt is not saved there and the request's own is not restored from it (server-context.cpp,
    get_available_slot), so the router picks slots only where that cache is off (`--cache-ram 0`, the
    plan's choice without shared prefixes; unset is llama-server's 8 GiB). Measured on an open-loop
    multi-turn run over two replicas (benchmarks/cache_routing.py): with the cache off, pinned 1.42x the
    minimum prompt tokens, not pinned 1.70x; pinned with a 1 GiB cache on, 3.1x and 4.1x in two runs on
    a shared machine, against 1.84x when llama-server chose the slot."""
    return options.get("cache_ram_mib") == 0


SPEC = EngineSpec(
    name="llama_server",
    adapter=LlamaServerAdapter,
    continues=True,
    capabilities=Capabilities(
        chat=True, completions=True, embeddings=True, tools=True, structured_output=True, logprobs=True,
        image_input=True, audio_input=True,  # with a projector (--mmproj in extra_args); text only without one
    ),
    install_hint="enginegate engines install llama-server",
    missing=missing_binary,
    plans_as="llamacpp",
    layout_options=layout_options,
    feature_options=feature_options,
    speculation=("ngram",),
    quantized_kv="q8_0",
    default_concurrency=64,
    slot_field="id_slot",
    slots_pay=slots_pay,
    server=ServerSpec(
        ready_path="/health",  # llama-server binds before loading: 503 while loading, 200 once it serves
        metrics_map={
            "requests_running": "llamacpp:requests_processing",
            "requests_waiting": "llamacpp:requests_deferred",
            "prompt_tokens_total": "llamacpp:prompt_tokens_total",
            "generation_tokens_total": "llamacpp:tokens_predicted_total",
            "kv_cache_usage_ratio": "llamacpp:kv_cache_usage_ratio",
            "draft_tokens_total": "llamacpp:spec_decode_num_draft_tokens_total",
            "draft_accepted_tokens_total": "llamacpp:spec_decode_num_accepted_tokens_total",
        },
    ),
)
