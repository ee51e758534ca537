"""Validation against OpenAI's own OpenAPI 3.1 component schemas (pinned in openai_schemas.json).

OAS 3.1 schemas are JSON Schema 2020-12, so `jsonschema`'s Draft 2020-12 validator checks them with the
pinned document registered as one resource; `$ref`s resolve inside it. `check(name, obj)` fails with
every violation listed, except the few where OpenAI's real API and its spec disagree (EXCEPTIONS: the
gateway follows the real API there, and each exception says why).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator, ValidationError
from jsonschema.validators import extend
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

PINNED = Path(__file__).with_name("openai_schemas.json")
BASE = "urn:openai-openapi"


@dataclass(frozen=True)
class SpecException:
    schema: str
    path: str
    """A regex over the violation's JSON path (`$.data[0].embedding`)."""
    validator: str
    reason: str


EXCEPTIONS: tuple[SpecException, ...] = (
    SpecException("CreateEmbeddingResponse", r"^\$\.data\[\d+\]\.embedding$", "type",
                  "encoding_format=base64: the real API sends the vector as one base64 string; the spec's "
                  "Embedding.embedding only allows an array of numbers"),
    SpecException("CreateCompletionResponse", r"^\$\.choices\[\d+\]\.finish_reason$", "type|enum",
                  "the spec has no completion-chunk schema and reuses CreateCompletionResponse, whose "
                  "finish_reason is never null; the real API's stream chunks carry finish_reason: null until the last"),
    SpecException("CreateCompletionResponse", r"^\$\.choices\[\d+\]\.logprobs\.(token_logprobs|top_logprobs)\[0\]$", "type",
                  "echo with logprobs: the real API (and vLLM, which lm-eval reads) gives the prompt's first token a null "
                  "logprob and null alternatives (nothing predicts it); the spec's arrays allow numbers/objects only"),
)


def _nullable(keyword: str) -> Any:
    """`nullable: true` is an OAS 3.0 keyword that this 3.1 document still uses (finish_reason and
    logprobs of stream chunks, ...): where the spec sets it, null passes, as the real API sends it."""
    original = Draft202012Validator.VALIDATORS[keyword]

    def check(validator: Any, value: Any, instance: Any, schema: dict[str, Any]) -> Any:
        if instance is None and schema.get("nullable") is True:
            return
        yield from original(validator, value, instance, schema)

    return check


SpecValidator = extend(Draft202012Validator, {"type": _nullable("type"), "enum": _nullable("enum")})


@cache
def _spec() -> dict[str, Any]:
    return json.loads(PINNED.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def spec_version() -> str:
    return str(_spec()["source"]["info.version"])


@cache
def _validator(name: str) -> Any:
    if name not in _spec()["components"]["schemas"]:
        raise KeyError(f"schema {name} is not pinned: add it to ROOTS in pin_schemas.py and pin again")
    resource = Resource.from_contents(_spec(), default_specification=DRAFT202012)
    registry: Registry[Any] = Registry().with_resource(BASE, resource)
    return SpecValidator({"$ref": f"{BASE}#/components/schemas/{name}"}, registry=registry)


@cache
def event_schemas() -> dict[str, str]:
    """Responses stream event type (`response.output_text.delta`) -> its schema's name."""
    schemas = _spec()["components"]["schemas"]
    found: dict[str, str] = {}
    for ref in schemas["ResponseStreamEvent"]["anyOf"]:
        name = ref["$ref"].rsplit("/", 1)[1]
        for kind in schemas[name]["properties"]["type"].get("enum", []):
            found[kind] = name
    return found


def _exempt(name: str, error: ValidationError) -> SpecException | None:
    for exc in EXCEPTIONS:
        if exc.schema == name and error.validator in exc.validator.split("|") and re.match(exc.path, error.json_path):
            return exc
    return None


def _explain(error: ValidationError) -> Iterable[str]:
    """The deepest causes of an anyOf/oneOf failure, or the error itself."""
    if error.context:
        deepest = max(len(e.absolute_path) for e in error.context)
        for sub in error.context:
            if len(sub.absolute_path) == deepest:
                yield f"{sub.json_path}: {sub.message[:300]}"
    else:
        yield f"{error.json_path}: {error.message[:300]}"


def problems(name: str, instance: Any) -> list[str]:
    out: list[str] = []
    for error in _validator(name).iter_errors(instance):
        if _exempt(name, error) is None and not _causes_exempt(name, error):
            out.extend(_explain(error))
    return out


def _causes_exempt(name: str, error: ValidationError) -> bool:
    """An anyOf/oneOf failure (a nullable object) whose deepest causes are all exceptions."""
    if not error.context:
        return False
    deepest = max(len(e.absolute_path) for e in error.context)
    causes = [sub for sub in error.context if len(sub.absolute_path) == deepest]
    return all(_exempt(name, sub) is not None for sub in causes)


def check(name: str, instance: Any) -> None:
    found = problems(name, instance)
    assert not found, f"{name} (OpenAI spec {spec_version()}) violated:\n  " + "\n  ".join(found[:20]) + \
        f"\nin: {json.dumps(instance)[:1500]}"


def check_event(event: dict[str, Any]) -> str:
    """A Responses stream event against the schema of its own type; returns the type."""
    kind = event.get("type")
    assert isinstance(kind, str) and kind in event_schemas(), f"unknown Responses stream event type {kind!r}"
    check(event_schemas()[kind], event)
    return kind
