"""Selection rules (gateway/data/selection.yaml): hard constraints first, then ordered preferences."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from adapters import registry
from adapters.spec import EngineSpec
from gateway.planning.installed import Installed
from gateway.planning.workload import Profile, read_yaml, validation_message

DEFAULT_RULES = Path(__file__).resolve().parents[1] / "data" / "selection.yaml"
ENGINES = ("llamacpp", "mlx", "exllamav2", "exllamav3", "vllm", "sglang", "tensorrt_llm", "dynamo")
"""The built-in engines the planner chooses among (plugins that declare a layout join them)."""


class EngineNeeds(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    accelerators: tuple[str, ...]
    formats: tuple[str, ...]
    min_compute_capability: float | None = None
    needs_fast_memory: bool = True
    install: str

    @classmethod
    def of(cls, spec: EngineSpec) -> EngineNeeds:
        return cls(
            accelerators=spec.accelerators,
            formats=spec.formats,
            min_compute_capability=spec.min_compute_capability,
            needs_fast_memory=spec.needs_fast_memory,
            install=spec.install_hint,
        )


def registry_engines() -> dict[str, dict[str, Any]]:
    """Every engine the planner can choose: those whose spec maps a planned layout to options (an engine that
    is a mode of another, `plans_as`, is planned as that one)."""
    plannable = [s for s in registry.specs() if s.layout_options is not None and s.plans_as is None]
    plannable.sort(key=lambda s: (ENGINES.index(s.name) if s.name in ENGINES else len(ENGINES), s.name))
    return {s.name: EngineNeeds.of(s).model_dump() for s in plannable}


class Rule(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    when: dict[str, Any] = Field(default_factory=dict)
    prefer: tuple[str, ...]
    because: str


class RuleBook(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    engines: dict[str, EngineNeeds]
    rules: tuple[Rule, ...]


class Candidate(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    engine: str
    rank: int
    rule: str
    because: str


class Rejection(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    engine: str
    constraint: str
    detail: str
    install: str | None = None


_CONDITIONS = {
    "accelerator",
    "gpus_min",
    "gpus_max",
    "consumer_gpu",
    "linked",
    "fit",
    "mode",
    "objective",
    "family",
    "moe",
    "format",
    "context_min",
    "shared_prefix",
    "heavy",
    "nodes_min",
    "memory_max_gib",
    "architecture",
    "any",
}


def _check_book(book: RuleBook, source: str) -> RuleBook:
    known = registry_engines()
    for name in book.engines:
        if name not in known:
            raise ValueError(f"{source}: unknown engine {name!r} (known: {', '.join(known)})")
    for rule in book.rules:
        for engine in rule.prefer:
            if engine not in book.engines:
                raise ValueError(f"{source}: rule {rule.name!r} prefers {engine!r}, which has no engines entry")
        _check_when(rule.when, f"{source}: rule {rule.name!r}")
    return book


def _check_when(when: dict[str, Any], where: str) -> None:
    unknown = set(when) - _CONDITIONS
    if unknown:
        raise ValueError(f"{where}: unknown condition(s) {', '.join(sorted(unknown))}")
    for sub in when.get("any", []):
        _check_when(sub, where)


@lru_cache(maxsize=8)
def _read(path: Path) -> dict[str, Any]:
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping with `engines` and `rules`")
    return data


def load_rules(user_file: Path | None = None, default_file: Path = DEFAULT_RULES) -> RuleBook:
    base = _read(default_file)
    engines = {**registry_engines(), **(base.get("engines") or {})}
    rules = list(base["rules"])
    if user_file is not None:
        user = _read(Path(user_file))
        for name, needs in (user.get("engines") or {}).items():
            engines[name] = {**engines.get(name, {}), **needs}
        rules = list(user.get("rules") or []) + ([] if user.get("replace_rules") else rules)
    try:
        book = RuleBook.model_validate({"engines": engines, "rules": rules})
    except ValidationError as exc:
        raise ValueError(validation_message(user_file or default_file, exc)) from None
    return _check_book(book, str(user_file or default_file))


def _holds(when: dict[str, Any], p: Profile) -> bool:
    def among(value: object, wanted: object) -> bool:
        return value in wanted if isinstance(wanted, list) else value == wanted

    for key, wanted in when.items():
        ok: bool
        if key == "any":
            ok = any(_holds(sub, p) for sub in wanted)
        elif key == "gpus_min":
            ok = p.gpus >= wanted
        elif key == "gpus_max":
            ok = p.gpus <= wanted
        elif key == "context_min":
            ok = p.context_length >= wanted
        elif key == "nodes_min":
            ok = p.nodes >= wanted
        elif key == "memory_max_gib":
            ok = p.memory_gib is not None and p.memory_gib <= wanted
        elif key == "linked":
            ok = (p.interconnect in ("nvlink", "nvswitch", "xgmi")) == wanted
        else:
            ok = among(getattr(p, key), wanted)
        if not ok:
            return False
    return True


def rank(book: RuleBook, profile: Profile) -> list[Candidate]:
    """Engines in preference order, each with the first rule that placed it."""
    ranked: list[Candidate] = []
    seen: set[str] = set()
    for rule in book.rules:
        if not _holds(rule.when, profile):
            continue
        for engine in rule.prefer:
            if engine not in seen:
                seen.add(engine)
                ranked.append(Candidate(engine=engine, rank=len(ranked) + 1, rule=rule.name, because=rule.because))
    return ranked


def violations(engine: str, needs: EngineNeeds, profile: Profile, installed: Installed | None) -> list[Rejection]:
    """Every hard constraint `engine` fails on this host, hardware first, installation last."""
    out: list[Rejection] = []
    if profile.accelerator not in needs.accelerators:
        have = "no GPU" if profile.accelerator == "none" else f"{profile.accelerator} GPU"
        out.append(
            Rejection(
                engine=engine,
                constraint="accelerator",
                detail=f"needs {' or '.join(needs.accelerators)}; this host has {have}",
            )
        )
    if (
        needs.min_compute_capability is not None
        and profile.accelerator == "nvidia"
        and profile.min_compute_capability is not None
        and profile.min_compute_capability < needs.min_compute_capability
    ):
        out.append(
            Rejection(
                engine=engine,
                constraint="compute_capability",
                detail=f"needs compute capability >= {needs.min_compute_capability:g}; "
                f"this GPU has {profile.min_compute_capability:g}",
            )
        )
    if profile.format not in needs.formats:
        out.append(
            Rejection(
                engine=engine, constraint="format", detail=f"loads {', '.join(needs.formats)}, not {profile.format}"
            )
        )
    figures = f": {profile.memory_figures}" if profile.memory_figures else ""
    if profile.fit == "none":
        out.append(
            Rejection(
                engine=engine,
                constraint="memory",
                detail=f"the weights and KV cache do not fit in this host's memory, GPUs and RAM together{figures}",
            )
        )
    elif needs.needs_fast_memory and profile.fit != "fast" and profile.accelerator != "none":
        out.append(
            Rejection(
                engine=engine,
                constraint="memory",
                detail=f"needs the weights and KV cache in GPU memory; they do not fit{figures}",
            )
        )
    if not out and installed is not None and not installed(engine):
        out.append(Rejection(engine=engine, constraint="installed", detail="not installed", install=needs.install))
    return out
