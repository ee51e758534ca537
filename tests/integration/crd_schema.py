"""Validate a custom resource offline against its CRD's openAPIV3Schema, as the API server would.

The schemas are upstream's, vendored by scripts/vendor_crd_schemas.py into tests/fixtures/crd-schemas/.
What is checked: every type, enum, pattern, length, bound and required field of the schema (JSON
Schema draft 4, whose boolean `exclusiveMinimum` is OpenAPI 3.0's), unknown fields as errors
(strict, as `kubectl apply --validate=strict`: structural schemas prune them), the uniqueness of
`x-kubernetes-list-type: map` keys and `set` items, and `metadata` against Kubernetes' own ObjectMeta
(through kubernetes-validate), and the CRD's CEL rules (`x-kubernetes-validations`) evaluated with
cel-python on the object after the schema's defaults are applied, as the API server does (property
names that are CEL keywords escaped as Kubernetes escapes them: `namespace` -> `__namespace__`).
Not checked: transition rules (`oldSelf`: updates only), the API server's CEL cost limits and the
Kubernetes-only CEL libraries (a rule that needs one fails as an evaluation error, never silently).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema

try:
    import celpy
except ImportError:  # an optional test dependency: without it the CEL rules are reported as not run
    celpy = None

SCHEMAS = Path(__file__).resolve().parents[1] / "fixtures" / "crd-schemas"


def load(api_version: str, kind: str) -> dict[str, Any]:
    group, version = api_version.split("/")
    return json.loads((SCHEMAS / f"{group}_{kind}_{version}.json").read_text())


def known(api_version: str, kind: str) -> bool:
    if "/" not in api_version:
        return False
    group, version = api_version.split("/")
    return (SCHEMAS / f"{group}_{kind}_{version}.json").exists()


def _strict(node: Any) -> Any:
    """Objects with declared properties refuse others; `nullable` admits null."""
    if isinstance(node, list):
        return [_strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


def _nodes(schema: dict[str, Any], value: Any, path: str = "") -> Iterator[tuple[dict[str, Any], Any, str]]:
    """Every (schema node, value, path) of `value` that its schema declares, the root first."""
    yield schema, value, path
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key, child in value.items():
            if key in props:
                yield from _nodes(props[key], child, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _nodes(schema.get("items", {}), item, f"{path}[{i}]")


def _list_errors(schema: dict[str, Any], value: Any) -> Iterator[str]:
    for node, items, path in _nodes(schema, value):
        if not isinstance(items, list):
            continue
        kind = node.get("x-kubernetes-list-type")
        if kind == "map":
            keys = [tuple(json.dumps(item.get(k), sort_keys=True) for k in node["x-kubernetes-list-map-keys"])
                    for item in items]
            if len(set(keys)) != len(keys):
                yield f"{path}: duplicate map-list keys {node['x-kubernetes-list-map-keys']}"
        elif kind == "set":
            encoded = [json.dumps(v, sort_keys=True) for v in items]
            if len(set(encoded)) != len(encoded):
                yield f"{path}: duplicate items in a set list"


CEL_RESERVED = frozenset({"true", "false", "null", "in", "as", "break", "const", "continue", "else", "for",
                          "function", "if", "import", "let", "loop", "package", "namespace", "return", "var"})


def _escape(name: str) -> str:
    """A property name as Kubernetes exposes it to CEL."""
    if name in CEL_RESERVED:
        return f"__{name}__"
    return (name.replace("__", "__underscores__").replace(".", "__dot__").replace("-", "__dash__")
            .replace("/", "__slash__"))


def _cel_value(value: Any) -> Any:
    if isinstance(value, dict):
        return {_escape(k): _cel_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cel_value(v) for v in value]
    return value


def _defaulted(schema: dict[str, Any], value: Any) -> Any:
    """The object with the schema's defaults filled in, as the API server stores it."""
    if isinstance(value, dict):
        props = schema.get("properties", {})
        out = {k: _defaulted(props.get(k, {}), v) for k, v in value.items()}
        for key, child in props.items():
            if key not in out and "default" in child:
                out[key] = _defaulted(child, copy.deepcopy(child["default"]))
        return out
    if isinstance(value, list):
        return [_defaulted(schema.get("items", {}), v) for v in value]
    return value


def _cel_errors(schema: dict[str, Any], value: Any) -> Iterator[str]:
    for node, self_value, path in _nodes(schema, value):
        for rule in node.get("x-kubernetes-validations", ()):
            if "oldSelf" not in rule["rule"]:
                yield from _cel_rule(rule, self_value, path or "<root>")


def _cel_rule(rule: dict[str, str], value: Any, path: str) -> Iterator[str]:
    if celpy is None:
        yield f"{path}: CEL rule not evaluated (pip install cel-python): {rule['rule']}"
        return
    env = celpy.Environment()
    try:
        result = env.program(env.compile(rule["rule"])).evaluate({"self": celpy.json_to_cel(_cel_value(value))})
    except Exception as exc:  # a rule cel-python cannot compile or run is reported, not passed
        yield f"{path}: CEL rule not evaluated ({type(exc).__name__}: {exc}): {rule['rule']}"
        return
    if not isinstance(result, (bool, celpy.celtypes.BoolType)):
        yield f"{path}: CEL rule evaluation error {result!r}: {rule['rule']}"
    elif not result:
        yield f"{path}: {rule.get('message') or 'failed'} (CEL: {rule['rule']})"


def errors(doc: dict[str, Any]) -> list[str]:
    """Everything the schema finds wrong with `doc` (empty: valid)."""
    import kubernetes_validate

    schema = load(doc["apiVersion"], doc["kind"])["schema"]
    body = copy.deepcopy(doc)
    found = [f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
             for e in jsonschema.Draft4Validator(_strict(schema)).iter_errors(body)]
    found += list(_list_errors(schema, body))
    if not found:  # as the API server: CEL runs on a structurally valid, defaulted object
        found += list(_cel_errors(schema, _defaulted(schema, body)))
    meta = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc.get("metadata", {})}
    try:  # ObjectMeta as Kubernetes defines it (the CRD schema says only `type: object`)
        kubernetes_validate.validate(meta, kubernetes_validate.latest_version(), strict=True)
    except kubernetes_validate.ValidationError as exc:
        found.append(f"metadata: {exc}")
    return found


def cel_rules(api_version: str, kind: str) -> list[str]:
    """Every CEL rule of the CRD's schema (wherever it applies)."""
    out: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            out.extend(rule["rule"] for rule in node.get("x-kubernetes-validations", ()))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(load(api_version, kind)["schema"])
    return out


def cel_applied(doc: dict[str, Any]) -> int:
    """How many CEL rules `errors(doc)` evaluates on this object (transition rules excluded)."""
    schema = load(doc["apiVersion"], doc["kind"])["schema"]
    return sum(1 for node, _, _ in _nodes(schema, _defaulted(schema, doc))
               for rule in node.get("x-kubernetes-validations", ()) if "oldSelf" not in rule["rule"])
