"""docs/reference/configuration.md from the pydantic settings models (gateway/config.py and what it nests).

One section per model, reached from `Settings` by walking its fields; a field's docstring
(`use_attribute_docstrings`) is its description.
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from gateway.config import Settings
from gateway.docgen.markdown import cell, table

ENV_PREFIX = "ENGINEGATE_"


@dataclass(frozen=True)
class Section:
    model: type[BaseModel]
    path: str  # the key path of the model's fields: "" for the top level, "models[]", "models[].routing"
    env: str | None  # the environment prefix of its fields (None inside a list: set the whole list as JSON)


def nested_models(annotation: Any) -> list[tuple[type[BaseModel], bool]]:
    """The pydantic models a field holds, each with whether it sits inside a list or mapping."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(annotation, False)]
    origin = typing.get_origin(annotation)
    found: list[tuple[type[BaseModel], bool]] = []
    for arg in typing.get_args(annotation):
        inner = origin in (tuple, list, set, frozenset, dict)
        found += [(m, listed or inner) for m, listed in nested_models(arg)]
    return found


def sections(model: type[BaseModel] = Settings, path: str = "", env: str | None = ENV_PREFIX) -> list[Section]:
    found = [Section(model, path, env)]
    for name, field in model.model_fields.items():
        for sub, listed in nested_models(field.annotation):
            sub_path = f"{path}.{name}" if path else name
            sub_env = None if env is None or listed else f"{env}{name.upper()}__"
            found += sections(sub, sub_path + ("[]" if listed else ""), sub_env)
    return found


def type_name(annotation: Any) -> str:
    if annotation is type(None):
        return "null"
    if annotation is Any:
        return "any"
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        return " \\| ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(type_name(a) for a in args)
    if origin in (tuple, list, set, frozenset):
        return f"list[{type_name(args[0])}]" if args else "list"
    if origin is dict:
        return f"map[{type_name(args[0])}, {type_name(args[1])}]"
    if isinstance(annotation, type) and issubclass(annotation, Path):
        return "path"
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return " \\| ".join(json.dumps(m.value) for m in annotation)
    return getattr(annotation, "__name__", str(annotation))


def bounds(field: FieldInfo) -> str:
    words = []
    for item in field.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            if isinstance(item, getattr(annotated_types, attr.capitalize())):
                words.append(f"{sign} {getattr(item, attr)}")
    return ", ".join(words)


def default_text(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "see below"
    if isinstance(value, tuple) and value and all(isinstance(v, BaseModel) for v in value):
        return "`[" + ", ".join(f"{type(v).__name__}()" if not v.model_dump(exclude_defaults=True)
                                else json.dumps(v.model_dump(mode="json", exclude_defaults=True)) for v in value) + "]`"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, tuple):
        value = list(value)
    return f"`{json.dumps(value)}`"


def render_section(section: Section) -> str:
    title = f"`{section.path}`" if section.path else "Top level"
    lines = [f"## {title}", ""]
    doc = (section.model.__doc__ or "").strip()
    if doc and section.model is not Settings:
        lines += [cell(doc), ""]
    lines.append(f"Model: `{section.model.__module__}.{section.model.__qualname__}`.")
    lines.append("")
    rows = []
    for name, field in section.model.model_fields.items():
        if field.exclude:
            continue
        key = f"`{name}`"
        kind = type_name(field.annotation)
        limit = bounds(field)
        env = f"`{section.env}{name.upper()}`" if section.env is not None else "-"
        rows.append([key, kind + (f" ({limit})" if limit else ""), default_text(field), env,
                     cell(field.description or "")])
    lines.append(table(["key", "type", "default", "environment", "description"], rows))
    return "\n".join(lines)


def undocumented() -> list[str]:
    """Fields without a description (a docstring under the field), as key paths."""
    return [f"{s.path + '.' if s.path else ''}{name}" for s in sections()
            for name, f in s.model.model_fields.items() if not f.exclude and not f.description]


def render() -> str:
    intro = [
        "# Configuration reference",
        "",
        "Every setting of `enginegate serve`, generated from the pydantic settings models",
        "(`gateway/config.py` and the models it nests). Precedence: command-line flags > `ENGINEGATE_*`",
        "environment variables > the YAML file (`--config FILE` or `ENGINEGATE_CONFIG`) > these defaults.",
        "Nested keys take `__` in the environment (`ENGINEGATE_RESPONSE_STORE__MAX_COUNT=500`); a list or",
        "mapping is set there as JSON (`ENGINEGATE_API_KEYS='[\"k1\"]'`); keys inside `models[]` are set",
        "in the YAML file (or the whole list as JSON in `ENGINEGATE_MODELS`). Unknown keys are refused.",
        "An engine's own `options` are listed with [the engines](../engines.md).",
        "`configs/gateway.example.yaml` in the repository is a commented example.",
        "",
    ]
    return "\n".join(intro) + "\n" + "\n\n".join(render_section(s) for s in sections())
