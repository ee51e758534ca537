"""What the gateway runs: hardware snapshot, one plan and one adapter per configured model.

Built once at start-up (detect -> resolve model -> plan -> adapter), started and stopped by
the app's lifespan. Tests build a Runtime around their own adapters.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adapters import registry
from adapters.base import Adapter, EngineError
from adapters.config import EngineConfig, resolve_options
from adapters.spec import EngineSpec
from gateway import hardware, loading, modelsource, planning, tracing, tuning
from gateway.config import ModelConfig, Settings
from gateway.hardware import HardwareSnapshot
from gateway.lora import plan as lora_plan
from gateway.planning import Plan
from gateway.planning.engine_traces import TraceTarget, with_engine_traces
from gateway.routing import Admission, Backend, Lifecycles, ModelLifecycle, ModelRegistry, Replica, replicas
from gateway.routing.budget import gib

log = logging.getLogger("enginegate")


@dataclass
class Runtime:
    settings: Settings
    models: ModelRegistry
    snapshot: HardwareSnapshot | None = None
    plans: dict[str, Plan] = field(default_factory=dict)
    started: bool = False

    lifecycles: Lifecycles = field(default_factory=lambda: Lifecycles({}))

    def __post_init__(self) -> None:
        """Backends built without a lifecycle (tests, benchmarks) are preloaded, outside any budget."""
        for backend in self.models:
            if backend.lifecycle is None:
                self.lifecycles.add(ModelLifecycle(backend, {}, preload=True))

    @classmethod
    def build(cls, settings: Settings) -> Runtime:
        snapshot = hardware.detect()
        models = ModelRegistry()
        plans: dict[str, Plan] = {}
        lifecycles = Lifecycles(loading.capacity(snapshot, settings.memory_budget),
                                load_timeout=settings.load_timeout_seconds, swap_batch=settings.swap_batch_requests)
        only_one = len(settings.models) == 1
        traces = trace_target(settings)
        for index, config in enumerate(settings.models):
            try:
                requested = registry.spec(config.engine) if config.engine != "auto" else None
            except registry.UnknownEngineError as exc:
                raise PlanningError(f"model {config.name or config.source!r}: {exc}") from exc
            if requested is not None and not requested.local_weights:
                backend = _remote_backend(config, requested, first=index == 0)
                _add(models, backend)
                lifecycles.add(ModelLifecycle(backend, {}, pinned=True, preload=config.preload is not False,
                                              ttl_seconds=config.ttl_seconds))
                continue
            resolved = modelsource.resolve(config.source)
            model_id = config.name or resolved.default_id
            plan = _plan(snapshot, Path(resolved.path), config.engine, config.workload)
            if config.adapters and plan is not None and config.engine == "auto":
                plan = _plan_for_adapters(snapshot, Path(resolved.path), plan, config)
            user = user_settings(config)
            if plan is not None:
                plan = planning.apply_user(plan, user, snapshot)
                plan = lora_plan.for_plan(plan, lora_options(config) if config.adapters else [], config.options)
            engine = registry.spec(plan.engine if plan is not None else config.engine)
            if plan is not None:
                plan = with_engine_traces(plan, engine, traces, user)
            build = _replica_builder(config, str(resolved.path), model_id)
            choices = loading.engine_choices(plan, engine, Path(resolved.path), snapshot, config, build)
            if config.adapters:
                extra = lora_plan.adapter_bytes([a["path"] for a in lora_options(config)])
                choices = [dataclasses.replace(c, charges=lora_plan.with_adapters(c.charges, extra)) for c in choices]
            replicas = choices[0].build()
            stem = resolved.path.stem  # a convenience alias, left to the first model served from that file
            aliases = tuple(config.aliases) + ((stem,) if stem != model_id and not models.known(stem) else ())
            if index == 0:
                aliases += ("default",)
            backend = Backend(
                model_id=model_id,
                adapter=replicas[0].adapter,
                admission=replicas[0].admission,
                plan=plan,
                aliases=tuple(dict.fromkeys(a for a in aliases if a != model_id)),
                created=int(time.time()),
                info={"origin": resolved.origin, "path": str(resolved.path)},
                replicas=replicas,
                routing=config.routing,
            )
            _add(models, backend)
            lifecycles.add(ModelLifecycle(backend, choices[0].charges, choices, pinned=config.pinned,
                                          preload=only_one if config.preload is None else config.preload,
                                          ttl_seconds=config.ttl_seconds))
            if plan is not None:
                plans[model_id] = plan
            _add_adapters(models, backend, config)
        errors = lifecycles.config_errors()
        if errors:
            budget = ", ".join(f"{pool} {gib(size)}" for pool, size in lifecycles.capacity.items())
            raise PlanningError("; ".join(errors) + f" [memory budget: {budget or 'none'}]")
        return cls(settings=settings, models=models, snapshot=snapshot, plans=plans, lifecycles=lifecycles)

    async def start(self) -> None:
        """Load the preload models; start-up fails only when every model is preloaded and none loaded."""
        failed = await self.lifecycles.preload()
        models = list(self.lifecycles)
        if failed and len(failed) == len(models) and all(lc.preload for lc in models):
            raise EngineError("; ".join(failed), 503, "engine_start_failed")
        for reason in failed:
            log.error("model %s; the other models keep serving", reason)
        self.started = True

    async def stop(self) -> None:
        self.started = False
        await self.lifecycles.stop()

    def summary(self, host: str, port: int, store: str | None = None, warnings: tuple[str, ...] = ()) -> str:
        lines = ["enginegate"]
        if self.snapshot is not None:
            lines.append(f"  host:   {self.snapshot.summary()}")
        for b in self.models:
            plan = self.plans.get(b.model_id)
            why = plan.summary() if plan is not None else b.engine
            lines.append(f"  model:  {b.model_id} <- {b.info.get('path', '?')}")
            lines.append(f"  engine: {why}")
            if len(b.replicas) > 1:
                each = ", ".join(f"{r.adapter.engine} ({r.admission.concurrency or 'no cap'} slots)" for r in b.replicas)
                lines.append(f"  replicas: {len(b.replicas)}: {each}; balance {b.routing.balance}, affinity {b.routing.affinity}")
            for override in plan.overridden if plan is not None else ():
                lines.append(f"  user:   {override.describe()}")
            for warning in plan.warnings if plan is not None else ():
                lines.append(f"  note:   {warning}")
            if b.lifecycle is not None:
                lines.append(f"  load:   {_load_line(b.lifecycle)}")
        if store is not None:
            lines.append(f"  store:  stored responses in {store}")
        lines.append(f"  listen: http://{host}:{port}/v1  (OpenAI-compatible; metrics at /metrics)")
        lines.extend(f"  WARNING: {warning}" for warning in warnings)
        return "\n".join(lines)


def _remote_backend(config: ModelConfig, engine: EngineSpec, first: bool) -> Backend:
    """A model served elsewhere (engine: openai): nothing to resolve or plan here."""
    model_id = config.name or config.source
    adapter_config = engine_config(config, engine, {}, source=config.source, name=model_id)
    replicas = _replicas(config, engine, adapter_config, config.source, model_id)
    aliases = tuple(config.aliases) + (("default",) if first else ())
    return Backend(
        model_id=model_id,
        adapter=replicas[0].adapter,
        admission=replicas[0].admission,
        aliases=tuple(dict.fromkeys(a for a in aliases if a != model_id)),
        created=int(time.time()),
        info={"origin": "remote", "path": replicas[0].adapter.describe().get("base_url", "")},
        replicas=replicas,
        routing=config.routing,
    )


def _add_adapters(models: ModelRegistry, backend: Backend, config: ModelConfig) -> None:
    """Each LoRA adapter as a model of its own on the base's engine (sharing its replicas and lifecycle)."""
    for entry in lora_options(config):
        child = Backend(model_id=entry["name"], adapter=backend.adapter, admission=backend.admission, plan=backend.plan,
                        created=backend.created, info={"origin": "adapter", "path": entry["path"]},
                        replicas=backend.replicas, routing=backend.routing, parent=backend.model_id)
        child.lifecycle, child.lifecycles = backend.lifecycle, backend.lifecycles
        try:
            models.add_adapter(child, backend)
        except ValueError as exc:
            raise PlanningError(f"{exc}: every model's and adapter's name must be unique") from exc


def _plan_for_adapters(snapshot: HardwareSnapshot, path: Path, plan: Plan, config: ModelConfig) -> Plan:
    """A plan whose engine cannot select an adapter per request is made again for one that can."""
    engine = lora_plan.engine_for_adapters(plan.engine)
    if engine is None:
        return plan
    again = _plan(snapshot, path, engine, config.workload)
    if again is None or again.engine != engine:
        return plan
    why = (f"{len(config.adapters)} LoRA adapter(s): served by {engine}, which selects one per request "
           f"(the plan's {plan.engine} loads one adapter per context)")
    return again.model_copy(update={"reasons": (*again.reasons, why)})


def lora_options(config: ModelConfig) -> list[dict[str, Any]]:
    """`options.lora_adapters` for the engine: each adapter's name, resolved file and scale."""
    out = []
    for a in config.adapters:
        try:
            path = modelsource.resolve(a.source).path if a.source is not None else Path(str(a.path)).expanduser()
        except modelsource.ModelSourceError as exc:
            raise PlanningError(f"adapter {a.name!r}: {exc}") from exc
        if not path.exists():
            raise PlanningError(f"adapter {a.name!r}: {path} does not exist")
        out.append({"name": a.name, "path": str(path.resolve()), "scale": a.scale})
    return out


def _load_line(lc: ModelLifecycle) -> str:
    when = {"loaded": "loaded", "failed": f"failed: {lc.reason}"}.get(lc.state.value, "on its first request")
    extras = [x for x in ("pinned" if lc.pinned else "", f"unloaded after {lc.ttl_seconds:g} s idle" if lc.ttl_seconds else "",
                          " ".join(f"{p} {gib(n)}" for p, n in lc.charges.items())) if x]
    fell = [f"{f.engine} failed ({f.reason})" for f in lc.failures]
    return "; ".join([when, *extras, *fell])


def _add(models: ModelRegistry, backend: Backend) -> None:
    try:
        models.add(backend)
    except ValueError as exc:
        raise PlanningError(f"{exc}: every model's name and aliases must be unique (set `name:` to tell them apart)") from exc


def _replica_builder(config: ModelConfig, source: str, model_id: str) -> loading.ReplicaBuilder:
    """How this model's replicas are built on one engine: the plan's first choice with the user's
    options and `backends:`, a fallback engine with its own planned options and no `backends:`."""

    def build(engine: EngineSpec, plan: Plan | None, user_options: bool) -> list[Replica]:
        planned = plan.options if plan is not None else {}
        cfg = config if user_options else config.model_copy(update={"options": {}, "backends": ()})
        adapter_config = engine_config(cfg, engine, planned, source=source, name=model_id)
        return _replicas(cfg, engine, adapter_config, source, model_id)

    return build


def _replicas(config: ModelConfig, engine: EngineSpec, primary: EngineConfig, source: str, model_id: str) -> list[Replica]:
    """The model's engine instances (`replicas: N`, then `backends:`), each with its own adapter and admission."""
    entries: list[tuple[str, dict[str, Any], dict[str, Any], bool]] = []
    for entry in config.backends:
        try:
            spec = registry.spec(entry.engine)
        except registry.UnknownEngineError as exc:
            raise PlanningError(f"model {model_id!r} backends: {exc}") from exc
        entry_config = config.model_copy(update={"engine": entry.engine, "options": {**config.options, **entry.options}}
                                         if spec.local_weights else {"engine": entry.engine, "options": dict(entry.options)})
        options = engine_config(entry_config, spec, {}, source=source, name=model_id).options
        entries += [(spec.name, dict(options), user_settings(entry_config), spec.local_weights)] * entry.replicas
    found = replicas.instances(config, engine.name, primary.options, user_settings(config), entries)

    def create(instance: replicas.Instance) -> Adapter:
        spec = registry.spec(instance.engine)
        src = source if spec.local_weights or instance.engine == engine.name else model_id
        return _create(spec, EngineConfig(source=src, name=model_id, options=instance.options,
                                          embeddings=config.embeddings, chat_format=config.chat_format))

    return replicas.build(found, create, config)


def trace_target(settings: Settings) -> TraceTarget | None:
    """Where the gateway sends its spans (None: it does not trace), for the engines that trace themselves."""
    try:
        plan = tracing.tracing_plan(settings.tracing, os.environ)
    except ValueError:  # a sampler or protocol tracing's own set-up refuses, and says so
        return None
    return TraceTarget(plan.endpoint, plan.protocol) if plan.on and plan.endpoint else None


class PlanningError(Exception):
    """No engine can serve the model here (or its engine cannot take its options); the message says why."""


def _create(engine: EngineSpec, config: EngineConfig) -> Adapter:
    try:
        return engine.create(config)
    except ValueError as exc:  # an option the adapter cannot take (e.g. engine openai without base_url)
        raise PlanningError(f"model {config.served!r} ({engine.name}): {exc}") from exc


def _plan(snapshot: HardwareSnapshot, path: Path, requested_engine: str,
          workload: planning.Workload | None = None) -> Plan | None:
    """The plan; None when the user named the engine and the model's files cannot be sized."""
    try:
        spec = planning.load_spec(path)
    except planning.SpecError as exc:
        if requested_engine == "auto":
            raise PlanningError(f"cannot read the model to plan for it ({exc}); set the model's engine explicitly") from exc
        log.warning("serving %s with %s unplanned: %s", path, requested_engine, exc)
        return None
    try:
        # the tune record for this host and model, if any: measured engine and options, calibrated speed
        workload = workload or planning.Workload()
        return tuning.apply_tuning(planning.plan(snapshot, spec, workload, requested_engine=requested_engine),
                                   tuning.lookup(snapshot, path, workload))
    except (planning.NoEngineError, ValueError) as exc:
        raise PlanningError(str(exc)) from exc


USER_FIELDS = ("context_length", "threads", "gpu_layers")
"""Top-level model fields that are engine options: set explicitly, they count as the user's."""


def user_settings(config: ModelConfig) -> dict[str, Any]:
    """What the user set explicitly for this model's engine: top-level fields and `options` alike."""
    explicit = config.model_dump(include=set(USER_FIELDS) & config.model_fields_set)
    return {**explicit, **config.options}


def engine_config(config: ModelConfig, engine: EngineSpec, planned: Mapping[str, Any], *,
                  source: str | None = None, name: str | None = None) -> EngineConfig:
    """The adapter's own config: engine defaults < the plan's options < the user's explicit settings."""
    options = resolve_options(engine.defaults, planned, user_settings(config)).options
    if config.adapters:
        options = {**options, "lora_adapters": lora_options(config)}
    return EngineConfig(source=source or config.source, name=name if name is not None else (config.name or ""),
                        options=options, embeddings=config.embeddings, chat_format=config.chat_format)


def runtime_for_adapters(settings: Settings, adapters: dict[str, Adapter], max_queue: int = 16) -> Runtime:
    """A runtime around ready-made adapters (tests): each preloaded, outside any memory budget."""
    models = ModelRegistry()
    for model_id, adapter in adapters.items():
        models.add(Backend(model_id=model_id, adapter=adapter, admission=Admission(1, max_queue), created=int(time.time())))
    return Runtime(settings=settings, models=models)
