"""ServerAdapter: an engine that is an OpenAI-compatible server of its own, launched and supervised.

What differs between engines is declared in their `ServerSpec` (launch command, readiness rule,
metrics map); process supervision is `ManagedProcess`, and every request goes through the one
`Relay`. Requests that arrive while the engine restarts wait for it (up to `ready_wait` seconds)
and then fail with 503.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import orjson

from adapters.base import (
    Adapter,
    Completion,
    EngineError,
    EngineStats,
    Health,
    RequestContext,
    StreamEvent,
)
from adapters.openai_http import Relay, Timeouts, Upstream, UpstreamConnectionError
from adapters.paths import engine_log_path
from adapters.process import Endpoint, Launch, ManagedProcess, ProcessError, ProcessState, RestartPolicy
from adapters.prom import engine_stats
from adapters.config import EngineConfig
from adapters.lora import LoraAdapter, lora_adapters, names, runtime_capacity, runtime_loading
from adapters.lora_runtime import RuntimeLoras, released_at_end
from adapters.model_name import renamed
from adapters.spec import EngineSpec, ServerSpec

ROUTES: Mapping[str, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
    "responses": "/v1/responses",
}


def timeouts_from(options: Mapping[str, Any]) -> Timeouts:
    defaults = Timeouts()
    return Timeouts(
        connect=float(options.get("connect_timeout", defaults.connect)),
        first_byte=float(options.get("first_byte_timeout", defaults.first_byte)),
        idle=float(options.get("idle_timeout", defaults.idle)),
        total=float(options.get("request_timeout", defaults.total)),
    )


def restart_policy_from(options: Mapping[str, Any]) -> RestartPolicy:
    defaults = RestartPolicy()
    return RestartPolicy(
        backoff_initial=float(options.get("restart_backoff", defaults.backoff_initial)),
        backoff_max=float(options.get("restart_backoff_max", defaults.backoff_max)),
        max_crashes=int(options.get("max_crashes", defaults.max_crashes)),
        window=float(options.get("crash_window", defaults.window)),
    )


class ServerAdapter(Adapter):
    ask_usage: ClassVar[bool] = True
    echoes_adapter_name: ClassVar[bool] = False
    """The engine answers a LoRA adapter's request under the adapter's name (vLLM); otherwise the gateway
    writes that name into the answer (adapters/model_name.py)."""
    loads_loras_at_runtime: ClassVar[bool] = False
    """The engine has endpoints to load and unload an adapter while it runs (`load_lora`, `unload_lora`)."""

    def __init__(self, config: EngineConfig, spec: EngineSpec) -> None:
        if spec.server is None:
            raise TypeError(f"engine {spec.name!r} declares no server: it cannot run as a ServerAdapter")
        self.spec = spec
        self.server: ServerSpec = spec.server
        self.declare(spec)
        self.config = config
        self.options = dict(config.options)
        self.served = config.served
        self.loras = lora_adapters(self.options)
        """LoRA adapters served as models of their own on this engine (adapters/lora.py)."""
        self.lora_names = names(self.loras)
        self.runtime_loras: RuntimeLoras | None = None
        """With `lora_loading: runtime`: the adapters the gateway has loaded, least recently used evicted."""
        if self.loras and self.loads_loras_at_runtime and runtime_loading(self.options):
            self.runtime_loras = RuntimeLoras(self, self.loras, runtime_capacity(self.loras, self.options),
                                              wait=float(self.options.get("ready_wait", 60.0)))
        self.upstream_model = self.server.upstream_model(config) if self.server.upstream_model else None
        self.relay = Relay(self.engine, timeouts_from(self.options))
        self.ready_wait = float(self.options.get("ready_wait", 60.0))
        self.wait_for_restart = bool(self.options.get("wait_for_restart", True))
        """False for one of several replicas: a request the dead engine never answered fails at once,
        so the gateway retries it on another replica instead of waiting for this one's restart."""
        self.process = self._new_process(self.launch, role="")

    def _new_process(self, launch: Any, role: str) -> ManagedProcess:
        # `instance` names one of several replicas of the model (their logs and processes apart)
        suffix = "".join(f"-{part}" for part in (self.options.get("instance"), role) if part)
        return ManagedProcess(
            f"{self.engine}:{self.served}{suffix}",
            launch,
            self.ready,
            startup_timeout=float(self.options.get("startup_timeout", self.server.startup_timeout)),
            stop_timeout=float(self.options.get("stop_timeout", 10.0)),
            restart=restart_policy_from(self.options),
            log_path=Path(self.options["log_dir"]) / f"{self.served}{suffix}.{self.engine}.log"
            if self.options.get("log_dir") else engine_log_path(self.engine, self.served + suffix),
            uses_api_key=self.server.uses_api_key,
        )

    @abc.abstractmethod
    def launch(self, endpoint: Endpoint) -> Launch: ...

    async def ready(self, process: ManagedProcess, endpoint: Endpoint) -> bool:
        """The spec's rule: its `ready_path` answers 200, or (None) the model list names a model."""
        if self.server.ready_path is None:
            return bool(await self.listed_models(endpoint))
        try:
            status, _ = await self.relay.get(self._upstream_for(endpoint), self.server.ready_path, timeout=10.0)
        except (UpstreamConnectionError, OSError, TimeoutError):
            return False
        return status == 200

    async def listed_models(self, endpoint: Endpoint) -> list[str]:
        """The ids in the engine's /v1/models; empty while it cannot answer."""
        try:
            status, raw = await self.relay.get(self._upstream_for(endpoint), "/v1/models", timeout=5.0)
        except (UpstreamConnectionError, OSError, TimeoutError):
            return []
        if status != 200:
            return []
        try:
            data = orjson.loads(raw).get("data")
        except (orjson.JSONDecodeError, AttributeError):
            return []
        return [str(m.get("id")) for m in data if isinstance(m, dict)] if isinstance(data, list) else []

    def _upstream_for(self, endpoint: Endpoint) -> Upstream:
        return Upstream(endpoint.base_url, endpoint.api_key or None, model=self.upstream_model, ask_usage=self.ask_usage)

    async def _upstream(self, process: ManagedProcess | None = None) -> Upstream:
        process = process or self.process
        try:
            endpoint = await process.wait_ready(self.ready_wait)
        except ProcessError as exc:
            raise EngineError(str(exc), 503, "engine_unavailable") from exc
        return self._upstream_for(endpoint)

    async def start(self) -> None:
        try:
            await self.process.start()
        except ProcessError as exc:
            raise EngineError(str(exc), 503, "engine_start_failed") from exc

    async def stop(self) -> None:
        try:
            await self.process.stop()
        finally:
            await self.relay.aclose()

    def ready_now(self) -> bool | None:
        return self.process.state is ProcessState.READY

    def incarnation(self) -> object:
        return (self.process.pid, self.process.restarts)

    def gave_up(self) -> str | None:
        return (self.process.detail or "failed") if self.process.state is ProcessState.FAILED else None

    async def health(self) -> Health:
        state = self.process.state
        detail = state.value + (f": {self.process.detail}" if self.process.detail else "")
        return Health(state is ProcessState.READY, detail)

    async def _forward(self, path: str, body: dict[str, Any], ctx: RequestContext,
                       process: ManagedProcess | None = None) -> Completion | AsyncIterator[StreamEvent]:
        process = process or self.process
        if process is not self.process or not self.loras:  # an embedder beside it loads no adapters
            return await self._forward_to(process, path, body, ctx)
        if self.runtime_loras is not None and ctx.model in self.lora_names:
            result = await self._with_runtime_lora(self.runtime_loras, process, path, body, ctx)
        else:
            result = await self._forward_to(process, path, self.select_lora(body, ctx), ctx)
        if self.echoes_adapter_name or ctx.model not in self.lora_names:
            return result  # the base (or an engine that names the adapter): the engine's bytes as they came
        return renamed(result, ctx.model, self.served)  # llama-server's alias, SGLang's model id

    async def _with_runtime_lora(self, loras: RuntimeLoras, process: ManagedProcess, path: str, body: dict[str, Any],
                                 ctx: RequestContext) -> Completion | AsyncIterator[StreamEvent]:
        """The request holds its adapter loaded from before it is sent until its answer ends."""
        name = ctx.model
        await loras.acquire(name, self.incarnation())
        try:
            result = await self._forward_to(process, path, self.select_lora(body, ctx), ctx)
        except BaseException:
            loras.release(name)
            raise
        if isinstance(result, Completion):
            loras.release(name)
            return result
        return released_at_end(result, lambda: loras.release(name))

    async def load_lora(self, adapter: LoraAdapter) -> None:
        raise EngineError(f"{self.engine} cannot load a LoRA adapter at run time", 503, "adapter_load_failed")

    async def unload_lora(self, name: str) -> None:
        raise EngineError(f"{self.engine} cannot unload a LoRA adapter at run time", 503, "adapter_load_failed")

    async def _lora_call(self, route: str, body: dict[str, Any], settled: tuple[str, ...]) -> None:
        """POST to the engine's adapter endpoint; an answer whose message has one of `settled` counts as done
        (loading one it has, unloading one it lacks: after a restart the gateway's record may lag the engine)."""
        ctx = RequestContext(request_id=f"lora-{body.get('lora_name')}", model=self.served)
        try:
            await self.relay.complete(await self._upstream(), route, body, ctx)
        except Exception as exc:
            if any(s in str(exc) for s in settled):
                return
            raise

    async def _forward_to(self, process: ManagedProcess, path: str, body: dict[str, Any],
                          ctx: RequestContext) -> Completion | AsyncIterator[StreamEvent]:
        upstream = await self._upstream(process)
        try:
            return await self.relay.forward(upstream, path, body, ctx)
        except EngineError as exc:
            # No response from an engine that just died (refused, or reset before any response
            # byte): the supervisor is restarting it, so wait for that and send once more. A
            # request that itself crashes the engine fails on that second try, with no loop.
            # (A dying process closes its sockets a moment before its exit can be seen.)
            if (not self.wait_for_restart or exc.code not in ("engine_unreachable", "engine_reset")
                    or not await self._died(process)):
                raise
        endpoint = process.endpoint
        deadline = asyncio.get_running_loop().time() + self.ready_wait
        while process.state is ProcessState.READY and process.endpoint is endpoint:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            await process.wait_changed(left)
        return await self.relay.forward(await self._upstream(process), path, body, ctx)

    def loaded_loras(self) -> frozenset[str]:
        """The adapters loaded now, while the engine is ready: every configured one (all load at start), or
        with runtime loading those the gateway has loaded."""
        if self.process.state is not ProcessState.READY:
            return frozenset()
        if self.runtime_loras is not None:
            return self.runtime_loras.loaded(self.incarnation())
        return self.lora_names

    def select_lora(self, body: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        """A request for one of the LoRA adapters names it as its `model` (vLLM's, SGLang's way)."""
        if ctx.model in names(self.loras) and body.get("model") != ctx.model:
            return {**body, "model": ctx.model}
        return body

    @staticmethod
    async def _died(process: ManagedProcess, grace: float = 1.0) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while not process.exited():
            if process.state is not ProcessState.READY:
                return True
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    async def chat(self, body: dict[str, Any], ctx: RequestContext) -> Completion | AsyncIterator[StreamEvent]:
        return await self._forward(ROUTES["chat"], body, ctx)

    async def completions(self, body: dict[str, Any], ctx: RequestContext) -> Completion | AsyncIterator[StreamEvent]:
        return await self._forward(ROUTES["completions"], body, ctx)

    async def responses(self, body: dict[str, Any], ctx: RequestContext) -> Completion | AsyncIterator[StreamEvent]:
        if not self.capabilities.responses:
            return await super().responses(body, ctx)
        return await self._forward(ROUTES["responses"], body, ctx)

    async def embeddings(self, body: dict[str, Any], ctx: RequestContext) -> Completion:
        result = await self._forward(ROUTES["embeddings"], {**body, "stream": False}, ctx)
        assert isinstance(result, Completion)
        return result

    async def engine_stats(self) -> EngineStats | None:
        if self.server.metrics_path is None or self.process.state is not ProcessState.READY:
            return None
        try:
            status, raw = await self.relay.get(await self._upstream(), self.server.metrics_path, timeout=2.0)
        except (UpstreamConnectionError, OSError, TimeoutError, EngineError):
            return None
        if status != 200:
            return None
        try:
            return engine_stats(raw.decode("utf-8", "replace"), self.server.metrics_map)
        except ValueError:
            return None

    def logs(self, lines: int = 100) -> list[str]:
        return self.process.log_tail(lines)

    def describe(self) -> dict[str, Any]:
        proc = self.process
        return {
            "engine": self.engine,
            "state": proc.state.value,
            "detail": proc.detail,
            "pid": proc.pid,
            "port": proc.endpoint.port if proc.endpoint else None,
            "restarts": proc.restarts,
            "log_path": str(proc.log_path) if proc.log_path else None,
        }
