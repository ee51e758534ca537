"""An already-running OpenAI-compatible server elsewhere (engine name `openai`, alias `external`).

Configured through the model's `options`:

    base_url: https://host/v1-prefix-less-root   (required; `/v1/...` paths are appended)
    api_key: sk-...        or  api_key_env: NAME_OF_ENV_VAR
    upstream_model: the id the upstream knows the model by (default: the served name)
    headers: {extra: header}        ask_usage: true        verify_on_start: true
    engine_metrics: llama_server | vllm | sglang | ...  the engine the upstream runs, to read its running and
        waiting requests from its Prometheus metrics (every client's, other gateways' among them): the load
        the router bounds a shared replica by; unset, the gateway knows only its own requests there
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import urlsplit

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
)
from adapters.openai_http import Relay, Upstream, UpstreamConnectionError, error_exception
from adapters.prom import engine_stats
from adapters.config import EngineConfig
from adapters.server import ROUTES, timeouts_from
from adapters.spec import EngineSpec


def _base_url(options: Mapping[str, Any]) -> str:
    url = options.get("base_url")
    if not isinstance(url, str) or not url:
        raise ValueError("engine 'openai' needs options.base_url, e.g. http://10.0.0.5:8000")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"options.base_url must be an http(s) URL, got {url!r}")
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _api_key(options: Mapping[str, Any]) -> str | None:
    if options.get("api_key"):
        return str(options["api_key"])
    env = options.get("api_key_env")
    if env:
        value = os.environ.get(str(env))
        if not value:
            raise ValueError(f"options.api_key_env names {env!r}, which is not set")
        return value
    return None


def _metrics_of(engine: object) -> tuple[str, Mapping[str, str]] | None:
    """The metrics path and names of the engine `options.engine_metrics` names (None: unset)."""
    if engine is None:
        return None
    from adapters import registry  # here: the registry imports this module

    if not isinstance(engine, str) or engine not in registry.names():
        raise ValueError(f"options.engine_metrics must name an engine ({', '.join(registry.names())}), got {engine!r}")
    server = registry.spec(engine).server
    if server is None or server.metrics_path is None or not server.metrics_map:
        raise ValueError(f"options.engine_metrics: {engine} has no Prometheus metrics the gateway reads")
    return server.metrics_path, server.metrics_map


class ExternalAdapter(Adapter):
    def __init__(self, config: EngineConfig, spec: EngineSpec) -> None:
        self.declare(spec)
        self.options = dict(config.options)
        self.served = config.served
        headers = self.options.get("headers", {})
        if not isinstance(headers, Mapping):
            raise ValueError("options.headers must be a mapping of header names to values")
        self.upstream = Upstream(
            _base_url(self.options),
            _api_key(self.options),
            model=str(self.options.get("upstream_model") or self.served),
            headers={str(k): str(v) for k, v in headers.items()},
            ask_usage=bool(self.options.get("ask_usage", True)),
        )
        self.relay = Relay(f"upstream {urlsplit(self.upstream.base_url).netloc}", timeouts_from(self.options))
        self._verify = bool(self.options.get("verify_on_start", True))
        self._metrics = _metrics_of(self.options.get("engine_metrics"))

    async def _models(self) -> list[str]:
        try:
            status, raw = await self.relay.get(self.upstream, "/v1/models", timeout=10.0)
        except (UpstreamConnectionError, OSError, TimeoutError) as exc:
            raise EngineError(f"{self.relay.engine} is unreachable: {exc or type(exc).__name__}", 503, "engine_unreachable") from exc
        if status != 200:
            raise error_exception(status, raw, self.relay.engine)
        try:
            data = orjson.loads(raw).get("data", [])
            return [str(m.get("id")) for m in data if isinstance(m, dict)]
        except (orjson.JSONDecodeError, AttributeError) as exc:
            raise EngineError(f"{self.relay.engine} sent a malformed model list", 502) from exc

    async def _check(self) -> None:
        models = await self._models()
        if models and self.upstream.model not in models:
            raise EngineError(
                f"{self.relay.engine} does not serve {self.upstream.model!r}; it serves: {', '.join(models[:20])}",
                503, "model_not_found",
            )

    async def start(self) -> None:
        if self._verify:
            await self._check()

    async def stop(self) -> None:
        await self.relay.aclose()

    async def health(self) -> Health:
        try:
            await self._check()
        except Exception as exc:  # noqa: BLE001 - health reports any failure as text
            return Health(False, str(exc))
        return Health(True, self.upstream.base_url)

    async def chat(self, body: dict[str, Any], ctx: RequestContext) -> Completion | AsyncIterator[StreamEvent]:
        return await self.relay.forward(self.upstream, ROUTES["chat"], body, ctx)

    async def completions(self, body: dict[str, Any], ctx: RequestContext) -> Completion | AsyncIterator[StreamEvent]:
        return await self.relay.forward(self.upstream, ROUTES["completions"], body, ctx)

    async def embeddings(self, body: dict[str, Any], ctx: RequestContext) -> Completion:
        return await self.relay.complete(self.upstream, ROUTES["embeddings"], body, ctx)

    async def engine_stats(self) -> EngineStats | None:
        if self._metrics is None:
            return None
        path, names = self._metrics
        try:
            status, raw = await self.relay.get(self.upstream, path, timeout=2.0)
        except (UpstreamConnectionError, OSError, TimeoutError, EngineError):
            return None
        if status != 200:
            return None
        try:
            return engine_stats(raw.decode("utf-8", "replace"), names)
        except ValueError:
            return None

    def describe(self) -> dict[str, Any]:
        return {"engine": self.engine, "base_url": self.upstream.base_url, "upstream_model": self.upstream.model}


SPEC = EngineSpec(
    name="openai",
    adapter=ExternalAdapter,
    capabilities=Capabilities(
        chat=True, completions=True, embeddings=True, tools=True, structured_output=True, n_choices=True, logprobs=True, image_input=True, audio_input=True,
    ),
    local_weights=False,  # nothing to resolve or plan: the model lives upstream
    default_concurrency=64,  # the engine batches and queues on its own
)
