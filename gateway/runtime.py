"""What the gateway runs: hardware snapshot, one plan and one adapter per configured model.

Built once at start-up (detect -> resolve model -> plan -> adapter), started and stopped by
the app's lifespan. Tests build a Runtime around their own adapters.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adapters import registry
from adapters.base import Adapter
from gateway import hardware, modelsource, planning
from gateway.config import ModelConfig, Settings
from gateway.routing import Admission, Backend, ModelRegistry

log = logging.getLogger("enginegate")


@dataclass
class Runtime:
    settings: Settings
    models: ModelRegistry
    snapshot: Any = None
    plans: dict[str, Any] = field(default_factory=dict)
    started: bool = False

    @classmethod
    def build(cls, settings: Settings) -> Runtime:
        snapshot = hardware.detect()
        models = ModelRegistry()
        plans: dict[str, Any] = {}
        for index, config in enumerate(settings.models):
            if config.engine != "auto" and not getattr(registry.get(config.engine), "local_weights", True):
                models.add(_remote_backend(config, first=index == 0))
                continue
            resolved = modelsource.resolve(config.source)
            model_id = config.name or resolved.default_id
            plan = _plan(snapshot, Path(resolved.path), config.engine)
            engine = plan.engine if plan is not None else config.engine
            base = plan.options if plan is not None else {}
            options = {**base, **{k: v for k, v in _config_options(config).items() if v is not None}}
            adapter_cls = registry.get(engine)
            local = config.model_copy(update={"source": str(resolved.path), "name": model_id})
            adapter = adapter_cls(local, options)
            aliases = tuple(config.aliases) + ((resolved.path.stem,) if resolved.path.stem != model_id else ())
            if index == 0:
                aliases += ("default",)
            models.add(
                Backend(
                    model_id=model_id,
                    adapter=adapter,
                    admission=Admission(concurrency=_concurrency(adapter_cls, options), max_queue=config.max_queue),
                    plan=plan,
                    aliases=tuple(dict.fromkeys(a for a in aliases if a != model_id)),
                    created=int(time.time()),
                    info={"origin": resolved.origin, "path": str(resolved.path)},
                )
            )
            if plan is not None:
                plans[model_id] = plan
        return cls(settings=settings, models=models, snapshot=snapshot, plans=plans)

    async def start(self) -> None:
        for backend in self.models:
            started = time.perf_counter()
            log.info("loading %s with %s", backend.model_id, backend.engine)
            await backend.adapter.start()
            backend.info["load_seconds"] = round(time.perf_counter() - started, 3)
        self.started = True

    async def stop(self) -> None:
        self.started = False
        await asyncio.gather(*(b.adapter.stop() for b in self.models), return_exceptions=True)

    def summary(self, host: str, port: int) -> str:
        lines = ["enginegate"]
        if self.snapshot is not None:
            lines.append(f"  host:   {self.snapshot.summary()}")
        for b in self.models:
            plan = self.plans.get(b.model_id)
            why = plan.summary() if plan is not None else b.engine
            lines.append(f"  model:  {b.model_id} <- {b.info.get('path', '?')}")
            lines.append(f"  engine: {why}")
            for warning in getattr(plan, "warnings", ()) or ():
                lines.append(f"  note:   {warning}")
        lines.append(f"  listen: http://{host}:{port}/v1  (OpenAI-compatible; metrics at /metrics)")
        return "\n".join(lines)


def _remote_backend(config: ModelConfig, first: bool) -> Backend:
    """A model served elsewhere (engine: openai): nothing to resolve or plan here."""
    model_id = config.name or config.source
    adapter = registry.get(config.engine)(config.model_copy(update={"name": model_id}), {})
    concurrency = int(config.options.get("max_concurrency", 64))
    aliases = tuple(config.aliases) + (("default",) if first else ())
    return Backend(
        model_id=model_id,
        adapter=adapter,
        admission=Admission(concurrency=concurrency, max_queue=config.max_queue),
        aliases=tuple(dict.fromkeys(a for a in aliases if a != model_id)),
        created=int(time.time()),
        info={"origin": "remote", "path": adapter.describe().get("base_url", "")},
    )


class PlanningError(Exception):
    """No engine can serve the model here; the message says why."""


def _plan(snapshot: Any, path: Path, requested_engine: str) -> Any:
    """The plan; None when the user named the engine and the model's files cannot be sized."""
    try:
        spec = planning.load_spec(path)
    except planning.SpecError as exc:
        if requested_engine == "auto":
            raise PlanningError(f"cannot read the model to plan for it ({exc}); set the model's engine explicitly") from exc
        log.warning("serving %s with %s unplanned: %s", path, requested_engine, exc)
        return None
    try:
        return planning.plan(snapshot, spec, requested_engine=requested_engine)
    except planning.NoEngineError as exc:
        raise PlanningError(str(exc)) from exc


def _concurrency(adapter_cls: type[Adapter], options: dict[str, Any]) -> int:
    """llama.cpp's slots are exact; batching engines get at least their default (they queue themselves)."""
    if options.get("parallel"):
        return int(options["parallel"])
    return max(int(options.get("max_concurrency") or 0), adapter_cls.default_concurrency)


def _config_options(config: ModelConfig) -> dict[str, Any]:
    """Options the user set explicitly win over the plan's."""
    explicit = config.model_fields_set
    mapping = {"context_length": "context_length", "threads": "threads", "gpu_layers": "gpu_layers"}
    return {opt: getattr(config, field_name) for field_name, opt in mapping.items() if field_name in explicit}


def runtime_for_adapters(settings: Settings, adapters: dict[str, Adapter], max_queue: int = 16) -> Runtime:
    models = ModelRegistry()
    for model_id, adapter in adapters.items():
        models.add(Backend(model_id=model_id, adapter=adapter, admission=Admission(1, max_queue), created=int(time.time())))
    return Runtime(settings=settings, models=models)
